"""Errors of OPA bundle loading, each naming the bundle member or the URL at fault.

::

    PolicyLoadError              (sidecar.policy: the policy source cannot be loaded)
     └── BundleError
          ├── BundleFetchError      the bytes could not be obtained (HTTP status, network, unreadable file)
          ├── BundleFormatError     not a bundle we can load (archive, unsafe member, size, manifest, data, Rego)
          └── BundleSignatureError  verification refused it (unsigned, wrong key, hash mismatch, missing file)

Subclassing ``PolicyLoadError`` lets a caller that reloads policies treat a bad
bundle like a bad policy directory: refuse it and keep the revision in force.
"""

from __future__ import annotations

from sidecar.policy import PolicyLoadError


class BundleError(PolicyLoadError):
    """A bundle cannot be used."""


class BundleFetchError(BundleError):
    """The bundle's bytes could not be obtained."""


class BundleFormatError(BundleError):
    """The bytes are not a bundle this sidecar can load."""


class BundleSignatureError(BundleError):
    """Signature verification refused the bundle."""
