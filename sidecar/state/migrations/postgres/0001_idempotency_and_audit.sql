-- Idempotency records and the append-only audit log, as in the SQLite store.

CREATE TABLE idempotency (
    tenant text NOT NULL,
    principal_id text NOT NULL,
    tool text NOT NULL,
    key text NOT NULL,
    request_hash text NOT NULL,
    request_id text NOT NULL,
    result_json text,
    created_at timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz,
    PRIMARY KEY (tenant, principal_id, tool, key)
);

CREATE TABLE audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id text NOT NULL,
    time text NOT NULL,
    principal_id text NOT NULL,
    tenant text NOT NULL,
    tool text NOT NULL,
    tool_version text NOT NULL,
    input_hash text NOT NULL,
    decisions_json text NOT NULL,
    policy_revision text NOT NULL,
    idempotency_key text,
    call_id text,
    conversation_id text,
    status text NOT NULL,
    error_code text,
    duration_ms integer NOT NULL
);
