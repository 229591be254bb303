"""Types of the part of opa-python-client 3.x that ``sidecar.policy.opa`` uses."""

from opa_client.opa_async import AsyncOpaClient as AsyncOpaClient

__all__ = ["AsyncOpaClient"]
