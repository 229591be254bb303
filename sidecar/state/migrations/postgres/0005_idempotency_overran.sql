-- When (epoch seconds) the handler of the call holding a key outlived its deadline: its outcome is
-- unknown from then on, until the handler's own result or an operator's resolution is stored.

ALTER TABLE idempotency ADD COLUMN overran_at double precision;
