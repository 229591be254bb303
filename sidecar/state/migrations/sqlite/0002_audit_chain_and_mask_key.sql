-- The audit hash chain (prev_hash, hash), masked arguments, and the key that masks them.

ALTER TABLE audit ADD COLUMN arguments_json TEXT;
ALTER TABLE audit ADD COLUMN prev_hash TEXT;
ALTER TABLE audit ADD COLUMN hash TEXT;

CREATE TABLE audit_mask_key (id INTEGER PRIMARY KEY CHECK (id = 1), key TEXT NOT NULL);
