-- One audit chain per store instance (sidecar.state.chain): appends of different sidecars no longer share a
-- lock. Chain 1 holds every event written before this version (and, on SQLite, every event since). A chain
-- started later links its first event to the newest event of the log when it started (link_id, link_hash).

CREATE TABLE audit_chains (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now(),
    link_id bigint,
    link_hash text
);

INSERT INTO audit_chains (started_at) VALUES (now());

ALTER TABLE audit ADD COLUMN chain_id bigint NOT NULL DEFAULT 1;

CREATE INDEX audit_chain_id ON audit (chain_id, id);
