-- The deadline (epoch seconds) of the call holding a key: in progress well past it means its sidecar died.

ALTER TABLE idempotency ADD COLUMN deadline_at REAL;
