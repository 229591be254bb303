"""Policy decisions for tool calls: what the rest of the sidecar imports from ``sidecar.policy``.

The package is organised by concept; this face re-exports the names callers use:

* ``sidecar.policy.decision``: ``Stage``, ``Decision`` and the checks of decision documents
  (``parse_decision``, ``parse_audit_masks``, ``RULES``, ``CALL_STAGES``);
* ``sidecar.policy.engine``: the ``PolicyEngine`` protocol and ``DelegatingEngine``, the base
  of engines wrapping another;
* ``sidecar.policy.input``: ``PolicyInput``, the input document of a decision.

The engines themselves (``embedded``, ``opa``), the decision cache (``cache``), hot reload
(``reload``, ``sources``), the policy set as read from disk (``files``), bundles (``bundle``),
the engines by kind (``engines``) and opening the configured engine (``factory``) are imported
from their modules.
"""

from __future__ import annotations

from sidecar.policy.decision import (
    AUDIT_MASK_RULE,
    CALL_STAGES,
    MAX_PREVIEW_TTL_SECONDS,
    RULES,
    Decision,
    Stage,
    parse_audit_masks,
    parse_decision,
)
from sidecar.policy.engine import DelegatingEngine, PolicyEngine
from sidecar.policy.input import PolicyInput

__all__ = [
    "AUDIT_MASK_RULE",
    "CALL_STAGES",
    "MAX_PREVIEW_TTL_SECONDS",
    "RULES",
    "Decision",
    "DelegatingEngine",
    "PolicyEngine",
    "PolicyInput",
    "Stage",
    "parse_audit_masks",
    "parse_decision",
]
