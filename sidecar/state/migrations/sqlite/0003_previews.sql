-- Previews of calls that need approval, and their approvals (times are epoch seconds).

CREATE TABLE previews (
    preview_id TEXT PRIMARY KEY, preview_hash TEXT NOT NULL, tenant TEXT NOT NULL, principal_id TEXT NOT NULL,
    tool TEXT NOT NULL, tool_version TEXT NOT NULL, call_json TEXT NOT NULL, policy_revision TEXT NOT NULL,
    reason TEXT NOT NULL, approver_roles TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL,
    state TEXT NOT NULL, decided_by TEXT, decided_at REAL, comment TEXT, used_at REAL,
    used_key TEXT
);

CREATE INDEX previews_state_created ON previews (state, created_at DESC);
