-- Idempotency records and the append-only audit log (times are epoch seconds).

CREATE TABLE idempotency (
    tenant TEXT NOT NULL, principal_id TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
    request_hash TEXT NOT NULL, request_id TEXT NOT NULL, result_json TEXT,
    created_at REAL NOT NULL, completed_at REAL,
    PRIMARY KEY (tenant, principal_id, tool, key)
);

CREATE TABLE audit (
    id INTEGER PRIMARY KEY, request_id TEXT NOT NULL, time TEXT NOT NULL,
    principal_id TEXT NOT NULL, tenant TEXT NOT NULL, tool TEXT NOT NULL, tool_version TEXT NOT NULL,
    input_hash TEXT NOT NULL, decisions_json TEXT NOT NULL,
    policy_revision TEXT NOT NULL, idempotency_key TEXT, call_id TEXT, conversation_id TEXT,
    status TEXT NOT NULL, error_code TEXT, duration_ms INTEGER NOT NULL
);
