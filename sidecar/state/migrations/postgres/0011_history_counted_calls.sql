-- A meter counts its calls from one covering index range: kind 'call' events only, by scope and time, with their
-- amounts and keys in the index. The calls of one idempotency key count as one: a call whose key already holds a
-- counted place is kept as kind 'retry' (counted by no meter; the oldest retry of a key takes the place of a
-- counted call given back), found by its key through a partial index of the keyed calls. Existing calls of a key
-- are counted once, at the first.

UPDATE toolbooth_history SET kind = 'retry'
WHERE kind = 'call' AND name <> '' AND EXISTS (
    SELECT 1 FROM toolbooth_history AS first
    WHERE first.scope = toolbooth_history.scope AND first.name = toolbooth_history.name AND first.kind = 'call'
      AND (first.at < toolbooth_history.at OR (first.at = toolbooth_history.at AND first.id < toolbooth_history.id))
);

DROP INDEX toolbooth_history_scope;
CREATE INDEX toolbooth_history_scope ON toolbooth_history (scope, kind, at, amount, name);
CREATE INDEX toolbooth_history_key ON toolbooth_history (name, scope, kind, at) WHERE name <> '' AND kind IN ('call', 'retry');
