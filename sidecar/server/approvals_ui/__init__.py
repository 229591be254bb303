"""The approval inbox: web pages, served by the sidecar, where a person approves or denies held calls.

``endpoint`` runs the listener (``approvals_ui.listen``), ``pages`` the pages and forms over the same
``ApprovalDesk`` as the ``ApprovalService`` RPCs, ``sessions`` and ``signin`` who is signed in,
``security`` the headers and request checks every response and request get, ``views`` how a preview
reads. ``docs/approvals.md`` describes it for its users.
"""

from sidecar.server.approvals_ui.endpoint import ApprovalsInbox

__all__ = ["ApprovalsInbox"]
