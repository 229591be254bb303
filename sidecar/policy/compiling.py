"""``compiled``: the one thread of a process on which policy sets are read, compiled and tested, off the event loop.

regorus allocates with mimalloc, whose heaps belong to threads: what an engine compiled and dropped on a thread
used stays in that thread's heap, for its next allocations. Compiled with ``asyncio.to_thread``, each reload ran
on whichever thread of the default executor was free and left one engine's worth (~5 MB for the bundled
policies) in another thread's heap, so a sidecar's memory grew with each reload until every thread of that
pool held one. On this one thread it is one engine's worth, once.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["compiled"]

P = ParamSpec("P")
T = TypeVar("T")

_thread: tuple[int, ThreadPoolExecutor] | None = None  # this process's, made at first use (a forked worker: its own)


async def compiled(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` run on the policy thread, awaited from the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))


def _executor() -> ThreadPoolExecutor:
    global _thread
    if _thread is None or _thread[0] != os.getpid():
        _thread = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolbooth-policy"))
    return _thread[1]
