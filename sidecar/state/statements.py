"""Every statement ``SqlStore`` runs, written once and spelled for one ``Dialect``: what a backend spells its own
way (placeholders, the clock, timestamps, an insert that skips a taken key, ``RETURNING``) comes from it."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sidecar.state.driver import Dialect
from sidecar.state.rows import CHAINED_COLUMNS, OPERATION_COLUMNS, PREVIEW_COLUMNS

__all__ = ["StoreStatements"]

_KEY = "tenant = ? AND principal_id = ? AND tool = ? AND key = ?"
# A page of previews (``PreviewQuery``): state, tool and requester (each ``NULL``: any), expiry after and by,
# created after, the cursor, the limit. The listing indexes (migration 0009) still order and bound the read.
_LISTED = ("state = ? AND tool = COALESCE(?, tool) AND principal_id = COALESCE(?, principal_id) AND expires_at > ? "
           "AND expires_at <= ? AND created_at > ? AND (created_at, preview_id) < (?, ?) "
           "ORDER BY created_at DESC, preview_id DESC LIMIT ?")


def _values(count: int) -> str:
    return ", ".join(["?"] * count)


@dataclass(frozen=True, slots=True)
class StoreStatements:
    """The store's SQL in one dialect. Claims, completions and releases name the key (``KeyScope`` order)."""

    claim: str  # insert a record unless the key is held; changes 1 row if it was free
    holder: str  # the request hash, then ``OPERATION_COLUMNS``, of the record holding a key
    complete: str  # only the claimer's record still without a result: an operator's resolution is never overwritten
    release: str  # likewise: a record with a result, or another request's, is never deleted by a release
    overran: str  # likewise: marks a record without a result unknown (its handler outlived the deadline)
    by_key: str
    by_request: str
    pending: str
    resolve: str
    expire: str
    insert_preview: str
    get_preview: str
    list_previews: str  # of every tenant: ``PreviewQuery`` order, after a cursor, within expiry and creation bounds
    list_tenant_previews: str  # the same of one tenant (its first parameter)
    pending_of_principal: str  # how many unexpired pending previews one principal holds
    decide_preview: str  # pending -> approved | denied, once
    consume_approval: str  # approved -> used, once
    restore_approval: str  # used -> approved: given back by the call that used it, when that call had no effect
    insert_audit: str  # the chain id, then ``CHAINED_COLUMNS``
    start_chain: str  # register a new chain after the newest link of the log: its id and that link's hash
    chains: str
    last_audit_link: str  # of one chain: id and hash of its newest link
    chain_after: str  # records of one chain after an id, oldest first, at most a limit
    audit_after: str  # records after an id, oldest first, at most a limit; ``_newest``: newest first
    audit_after_newest: str
    audit_all_after: str  # the same without a limit
    audit_all_after_newest: str
    audit_of_approvals: str  # records of calls that carried an approval, since an audit time, newest first
    set_mask_key: str
    mask_key: str

    @classmethod
    def of(cls, d: Dialect) -> StoreStatements:
        """The statements spelled for ``d``."""
        columns = f"{', '.join(OPERATION_COLUMNS[:-1])}, {d.epoch.format('created_at')}"
        operation = f"SELECT {columns} FROM idempotency"
        previews = ", ".join(PREVIEW_COLUMNS)
        audit = f"SELECT id, chain_id, {', '.join(CHAINED_COLUMNS)} FROM audit WHERE id > ?"
        text = cls(
            claim=d.insert_new.format("idempotency (tenant, principal_id, tool, key, request_hash, request_id, "
                                      f"deadline_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, {d.now})"),
            holder=f"SELECT request_hash, {columns} FROM idempotency WHERE {_KEY}",
            complete=f"UPDATE idempotency SET result_json = ?, completed_at = {d.now} "
                     f"WHERE {_KEY} AND result_json IS NULL AND request_id = ?",
            release=f"DELETE FROM idempotency WHERE {_KEY} AND result_json IS NULL AND request_id = ?",
            overran=f"UPDATE idempotency SET overran_at = ? WHERE {_KEY} AND result_json IS NULL",
            by_key=f"{operation} WHERE {_KEY}",
            by_request=f"{operation} WHERE tenant = ? AND principal_id = ? AND request_id = ?",
            pending=f"{operation} WHERE result_json IS NULL ORDER BY created_at LIMIT ?",
            resolve=f"UPDATE idempotency SET result_json = ?, completed_at = {d.timestamp.format('?')} "
                    f"WHERE {_KEY} AND result_json IS NULL",
            expire="DELETE FROM idempotency WHERE result_json IS NOT NULL "
                   f"AND completed_at < {d.timestamp.format('?')}",
            insert_preview=f"INSERT INTO previews ({previews}) VALUES ({_values(len(PREVIEW_COLUMNS))})",
            get_preview=f"SELECT {previews} FROM previews WHERE preview_id = ?",
            list_previews=f"SELECT {previews} FROM previews WHERE {_LISTED}",
            list_tenant_previews=f"SELECT {previews} FROM previews WHERE tenant = ? AND {_LISTED}",
            pending_of_principal="SELECT count(*) FROM previews WHERE tenant = ? AND principal_id = ? "
                                 "AND state = 'pending' AND expires_at > ?",
            decide_preview="UPDATE previews SET state = ?, decided_by = ?, comment = ?, decided_at = ? "
                           "WHERE preview_id = ? AND state = 'pending'",
            consume_approval="UPDATE previews SET state = 'used', used_at = ?, used_key = ? "
                             "WHERE preview_id = ? AND state = 'approved'",
            restore_approval="UPDATE previews SET state = 'approved', used_at = NULL, used_key = NULL "
                             "WHERE preview_id = ? AND state = 'used'",
            insert_audit=f"INSERT INTO audit (chain_id, {', '.join(CHAINED_COLUMNS)}) "
                         f"VALUES (?, {_values(len(CHAINED_COLUMNS))})",
            start_chain=d.returning.format(
                f"INSERT INTO audit_chains (started_at, link_id, link_hash) SELECT {d.now}, l.id, l.hash "
                "FROM (SELECT 1 AS one) o LEFT JOIN (SELECT id, hash FROM audit WHERE hash IS NOT NULL "
                "ORDER BY id DESC LIMIT 1) l ON o.one = 1", "id, link_hash"),
            chains="SELECT id, link_id, link_hash FROM audit_chains ORDER BY id",
            last_audit_link="SELECT id, hash FROM audit WHERE chain_id = ? AND hash IS NOT NULL "
                            "ORDER BY id DESC LIMIT 1",
            chain_after=f"{audit} AND chain_id = ? ORDER BY id ASC LIMIT ?",
            audit_after=f"{audit} ORDER BY id ASC LIMIT ?",
            audit_after_newest=f"{audit} ORDER BY id DESC LIMIT ?",
            audit_all_after=f"{audit} ORDER BY id ASC",
            audit_all_after_newest=f"{audit} ORDER BY id DESC",
            audit_of_approvals=f"{audit} AND time >= ? AND decisions_json LIKE ? ORDER BY id DESC LIMIT ?",
            set_mask_key=d.insert_new.format("audit_mask_key (id, key) VALUES (1, ?)"),
            mask_key="SELECT key FROM audit_mask_key",
        )
        return cls(**{f.name: d.sql(getattr(text, f.name)) for f in fields(cls)})
