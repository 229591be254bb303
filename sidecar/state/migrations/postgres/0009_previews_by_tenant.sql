-- The pending previews an approver may decide are read from their own tenant's, newest first, a page at a
-- time after a (created_at, preview_id) cursor, the expired ones skipped within the index; a principal's
-- unexpired pending previews are counted before another is stored (the cap). Before, a listing read the
-- newest previews of every tenant and filtered them afterwards, so another tenant's flood hid one's own.

CREATE INDEX previews_tenant_listing ON previews (tenant, state, created_at DESC, preview_id DESC, expires_at);
-- An operator's listing, of every tenant, in the same order.
DROP INDEX previews_state_created;
CREATE INDEX previews_state_listing ON previews (state, created_at DESC, preview_id DESC, expires_at);
CREATE INDEX previews_principal_pending ON previews (tenant, principal_id, state, expires_at);
