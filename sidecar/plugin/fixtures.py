"""pytest fixtures of the plugin test kit (``sidecar.plugin.testing``); a plugin's conftest imports them::

    # tests/conftest.py
    from sidecar.plugin.fixtures import tool_context, toolbooth_gate

    __all__ = ["tool_context", "toolbooth_gate"]

``tool_context(tool, ...)`` is ``make_context``; ``await toolbooth_gate(tools, ...)`` is an ``open_gate`` kept
open until the test ends, its store in the test's ``tmp_path``. This module imports pytest and pytest-asyncio
(the ``test`` extra): only tests import it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sidecar.plugin.testing import Gate, make_context, open_gate
from sidecar.tools.definition import ToolContext

__all__ = ["ContextFactory", "GateOpener", "tool_context", "toolbooth_gate"]

ContextFactory = Callable[..., ToolContext]
GateOpener = Callable[..., Awaitable[Gate]]


@pytest.fixture
def tool_context() -> ContextFactory:
    """``tool_context(tool, principal=..., settings=..., ...)``: the context the sidecar gives the handler
    (``sidecar.plugin.testing.make_context``)."""
    return make_context


@pytest_asyncio.fixture
async def toolbooth_gate(tmp_path: Path) -> AsyncIterator[GateOpener]:
    """``await toolbooth_gate(tools, principal=..., policies=..., ...)``: a ``Gate`` (``open_gate``'s options)
    whose store is in ``tmp_path``; every gate opened is closed when the test ends."""
    numbers = itertools.count(1)
    async with AsyncExitStack() as stack:

        async def opener(tools: Any, **options: Any) -> Gate:
            state = tmp_path / f"gate-{next(numbers)}"  # one store per gate of the test
            state.mkdir()
            options.setdefault("state_dir", state)
            return await stack.enter_async_context(open_gate(tools, **options))

        yield opener
