"""Where plugins written before ``sidecar.plugin`` existed import ``SENSITIVE`` from (kept for them).

New code imports ``SENSITIVE`` from ``sidecar.plugin``; the masking itself lives in ``sidecar.tools.masking``.
"""

from __future__ import annotations

from sidecar.tools.masking import MASK_PREFIX, SENSITIVE

__all__ = ["MASK_PREFIX", "SENSITIVE"]
