"""OPA bundles: the policy set as one signed, versioned archive.

* ``sidecar.policy.bundle.format``: ``load_bundle`` (check, verify) and ``build_bundle`` (from a
  policy directory), ``Bundle`` and its ``Manifest``;
* ``sidecar.policy.bundle.archive``: the gzipped tarball, read safely and written reproducibly;
* ``sidecar.policy.bundle.signing``: ``.signatures.json``, as OPA signs and verifies it;
* ``sidecar.policy.bundle.fetch``: a bundle URL polled with conditional GETs.

This face re-exports what callers use.
"""

from __future__ import annotations

from sidecar.policy.bundle.fetch import BundleFetcher, FetchResult
from sidecar.policy.bundle.format import Bundle, Manifest, build_bundle, load_bundle
from sidecar.policy.bundle.signing import VerificationConfig

__all__ = ["Bundle", "BundleFetcher", "FetchResult", "Manifest", "VerificationConfig", "build_bundle", "load_bundle"]
