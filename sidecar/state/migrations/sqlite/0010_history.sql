-- The history of calls that policies read (sidecar.state.history), one row per event, times in epoch seconds. scope
-- is a hashed key: a meter's (whose calls it counts together) or a conversation's. kind 'call' is a call counted by
-- a meter (amount: what it adds to the meter's sum; name: its idempotency key, hashed, or ''), reserved before it
-- is decided and deleted if it does not run; 'label' a label a conversation's result carried (name); 'failure' an
-- earlier failure of a call (name: the call's hash, detail: its error code). Events are read by scope after a time,
-- and expired by time.

CREATE TABLE toolbooth_history (
    id INTEGER PRIMARY KEY, scope TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL,
    tool TEXT NOT NULL, detail TEXT NOT NULL, amount REAL NOT NULL, request_id TEXT NOT NULL
);

CREATE INDEX toolbooth_history_scope ON toolbooth_history (scope, at);
CREATE INDEX toolbooth_history_at ON toolbooth_history (at);
