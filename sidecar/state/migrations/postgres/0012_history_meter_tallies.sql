-- A tally per meter scope: the number (calls) and the sum of the amounts (total) of the scope's 'call' events after
-- since. A call moves it to its meter's window, taking off the events that left it (sidecar.state.history_sql), so a
-- count reads about one event per call instead of the whole window. A missing tally is counted again from the
-- events; tallies starting before the history's retention are deleted with the events.

CREATE TABLE toolbooth_history_meters (
    scope text PRIMARY KEY,
    since double precision NOT NULL,
    calls bigint NOT NULL,
    total double precision NOT NULL
);

-- A key's counted calls and their amounts, read from the index of keyed calls alone.
DROP INDEX toolbooth_history_key;
CREATE INDEX toolbooth_history_key ON toolbooth_history (name, scope, kind, at, amount)
    WHERE name <> '' AND kind IN ('call', 'retry');
