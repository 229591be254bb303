-- The history of calls that policies read (sidecar.state.history), one row per event, times in epoch seconds. scope
-- is a hashed key: a meter's (whose calls it counts together) or a conversation's. kind 'call' is a call counted by
-- a meter (amount: what it adds to the meter's sum; name: its idempotency key, hashed, or ''), reserved before it
-- is decided and deleted if it does not run; 'label' a label a conversation's result carried (name); 'failure' an
-- earlier failure of a call (name: the call's hash, detail: its error code). Events are read by scope after a time,
-- and expired by time.

CREATE TABLE toolbooth_history (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope text NOT NULL,
    at double precision NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    tool text NOT NULL,
    detail text NOT NULL,
    amount double precision NOT NULL,
    request_id text NOT NULL
);

CREATE INDEX toolbooth_history_scope ON toolbooth_history (scope, at);
CREATE INDEX toolbooth_history_at ON toolbooth_history (at);
