-- The audit hash chain (prev_hash, hash), masked arguments, and the key that masks them.

ALTER TABLE audit
    ADD COLUMN arguments_json text,
    ADD COLUMN prev_hash text,
    ADD COLUMN hash text;

CREATE TABLE audit_mask_key (
    id integer PRIMARY KEY CHECK (id = 1),
    key text NOT NULL
);
