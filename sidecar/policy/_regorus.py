"""regorus, as the sidecar imports it: with Rust's library backtraces turned off first.

regorus reports an evaluation error as an ``anyhow`` error, which captures a backtrace
when the environment asks for one: ``RUST_LIB_BACKTRACE``, or when that is unset,
``RUST_BACKTRACE`` (set to 1 on many developer machines and CI runners). Capturing costs
milliseconds per failing decision, on the event loop, against microseconds without; and
the engines strip the backtrace from every message anyway (``clean_regorus_error``). The
Rust standard library reads the variables at the first capture and keeps the answer for
the life of the process, so they must be set before regorus first fails: every sidecar
module imports regorus from here, and importing this module sets
``RUST_LIB_BACKTRACE=0``, whatever it was. Library backtraces are then never captured,
in the sidecar or the CLI, while a panic's backtrace still follows ``RUST_BACKTRACE``.
Child processes inherit the setting.
"""

from __future__ import annotations

import os

os.environ["RUST_LIB_BACKTRACE"] = "0"  # before regorus can capture a backtrace: see above

import regorus  # after the environment is set, on purpose

__all__ = ["regorus"]
