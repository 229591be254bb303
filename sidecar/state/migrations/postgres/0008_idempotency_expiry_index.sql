-- The records the expiry deletes (finished, completed before the retention): found by this index. Without it,
-- the DELETE that runs every minute read the whole table, which holds every key of the retention period,
-- while holding the write lock.

CREATE INDEX idempotency_completed ON idempotency (completed_at) WHERE result_json IS NOT NULL;
