-- Previews of calls that need approval, and their approvals (sidecar.state.previews).

CREATE TABLE previews (
    preview_id text PRIMARY KEY,
    preview_hash text NOT NULL,
    tenant text NOT NULL,
    principal_id text NOT NULL,
    tool text NOT NULL,
    tool_version text NOT NULL,
    call_json text NOT NULL,
    policy_revision text NOT NULL,
    reason text NOT NULL,
    approver_roles text NOT NULL,
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'used')),
    decided_by text,
    decided_at double precision,
    comment text,
    used_at double precision,
    used_key text
);

CREATE INDEX previews_state_created ON previews (state, created_at DESC);
