-- One audit chain per store instance (sidecar.state.chain), as on PostgreSQL. SQLite takes one writer at a
-- time, so every store of a file appends to chain 1, which also holds every event written before this version.

CREATE TABLE audit_chains (
    id INTEGER PRIMARY KEY, started_at REAL NOT NULL, link_id INTEGER, link_hash TEXT
);

INSERT INTO audit_chains (id, started_at) VALUES (1, 0);

ALTER TABLE audit ADD COLUMN chain_id INTEGER NOT NULL DEFAULT 1;

CREATE INDEX audit_chain_id ON audit (chain_id, id);
