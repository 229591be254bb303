"""The keyed write of the soak benchmark (``soak.py``): a tool with side effects whose every real run leaves a line.

``soak.py`` installs it for its sidecar as the plugin ``soak`` (a minimal distribution on ``PYTHONPATH`` naming
``soak_tools:PLUGIN``). Each execution appends ``KEY`` to the file ``$SOAK_EXECUTIONS_FILE`` (``O_APPEND``,
one ``write``), so the benchmark can count how often each key really ran: exactly once for a key it got a
fresh success for, and never more.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from sidecar.plugin import Plugin, SideEffect, ToolContext, tool

EXECUTIONS_ENV = "SOAK_EXECUTIONS_FILE"  # not TOOLBOOTH_*: those are settings


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(max_length=200)


class Written(BaseModel):
    key: str


@tool(name="soak_write", version="1.0.0", side_effect=SideEffect.INTERNAL_REVERSIBLE, timeout=10)
async def soak_write(args: Note, ctx: ToolContext) -> Written:
    """Record one execution of ``args.key``."""
    fd = os.open(os.environ[EXECUTIONS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{args.key}\n".encode())
    finally:
        os.close(fd)
    return Written(key=args.key)


PLUGIN = Plugin([soak_write])
