"""``AsyncOpaClient``: the attributes and methods ``sidecar.policy.opa`` uses or overrides."""

from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp

__all__ = ["AsyncOpaClient"]

class AsyncOpaClient:
    """OPA's REST API over an aiohttp session (opened by ``_init_session``)."""

    host: str
    port: int
    version: str
    ssl: bool
    cert: str | tuple[str, str] | None
    timeout: float
    retries: int
    schema: str
    root_url: str
    headers: dict[str, str] | None
    _session: aiohttp.ClientSession | None
    _connector: aiohttp.TCPConnector | None

    def __init__(self, host: str = "localhost", port: int = 8181, version: str = "v1", ssl: bool = False,
                 cert: str | tuple[str, str] | None = None, headers: dict[str, str] | None = None,
                 token: str | None = None, retries: int = 2, timeout: float = 1.5) -> None: ...
    async def _init_session(self) -> None: ...
    def _request(self, method: str, url: str, **kwargs: Any) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
        """The response to one request (retried ``retries`` times on a connection error or a 502/503/504)."""
    async def close_connection(self) -> None: ...
    async def get_policies_list(self) -> list[Any]:
        """The ``id`` of every policy module the server holds."""
    async def update_policy_from_string(self, new_policy: str, endpoint: str, rego_compat: bool = True) -> bool: ...
    async def update_or_create_data(self, new_data: dict[str, Any], endpoint: str) -> Any:
        """``True`` on 204, else the answer's JSON."""
    async def delete_policy(self, policy_name: str) -> bool: ...
