"""Waiting for an event in tests: until a condition holds, or until a moment has passed, always with a deadline.

The short pause between two looks is not a wait for anything to happen: the condition ends the wait and the
deadline bounds it, so a loaded machine makes a test slower, never wrong.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

__all__ = ["past", "until", "until_blocking"]

_LOOK_AGAIN = 0.005  # seconds between two looks at the condition


async def until(condition: Callable[[], bool | Awaitable[bool]], *, timeout: float = 10.0,
                what: str = "the condition") -> None:
    """Return once ``condition()`` (a function or a coroutine function) is true; ``AssertionError`` naming
    ``what`` if it is not within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                held = condition()
                if await held if inspect.isawaitable(held) else held:
                    return
                await asyncio.sleep(_LOOK_AGAIN)
    except TimeoutError:
        raise AssertionError(f"{what} did not hold within {timeout} s") from None


def until_blocking(condition: Callable[[], bool], *, timeout: float = 10.0, what: str = "the condition") -> None:
    """``until`` for synchronous tests (a child process, a socket): return once ``condition()`` is true;
    ``AssertionError`` naming ``what`` if it is not within ``timeout`` seconds. ``condition`` may raise to
    end the wait at once (e.g. the process it waits for has exited)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout} s")
        time.sleep(_LOOK_AGAIN)


async def past(moment: float) -> None:
    """Return once ``time.time()`` is past ``moment`` (epoch seconds), e.g. a call's deadline."""
    while (left := moment - time.time()) >= 0:
        await asyncio.sleep(left + 0.001)
