"""Flag helpers beside ``sidecar.cli.common``'s: a flag's older spelling that still works (``Deprecated``), the
policy directory under its one name, ``--policies`` (``policies_flag``), and typed values."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sidecar.cli.common import EXIT_USAGE, CommandError

__all__ = ["Deprecated", "given_policies", "policies_flag", "positive_seconds", "renamed"]


class Deprecated(argparse.Action):
    """An older spelling of a flag (or a positional argument) that still works: its value is stored under its
    own ``dest`` (the command reads both, ``renamed``); its help, and a note on stderr when stderr is a terminal
    (a script's stderr stays as it was), name the spelling to use."""

    def __init__(self, option_strings: list[str], dest: str, *, instead: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is None:  # an optional positional argument not given
            return
        if sys.stderr.isatty():
            used = option_string or self.metavar or self.dest
            print(f"toolbooth: note: {used} is deprecated; use {self.instead}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def renamed(args: argparse.Namespace, name: str, old: str, flag: str) -> Any:
    """The value of ``flag`` (``args.<name>``) or of its older spelling (``args.<old>``); a usage error for both."""
    new_value, old_value = getattr(args, name), getattr(args, old)
    if new_value is not None and old_value is not None:
        raise CommandError(f"{flag} is given twice, once in an older spelling: give it once", EXIT_USAGE)
    return old_value if new_value is None else new_value


def positive_seconds(text: str) -> float:
    """A ``--timeout`` value: seconds, more than 0."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: expected more than 0 seconds")
    return seconds


def policies_flag(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """``--policies DIR``, the policy directory, as ``serve`` and ``replay`` spell it; its older spellings still
    work with a note: the positional ``DIR`` (``positional``), else ``--dir``."""
    parser.add_argument("--policies", type=Path, metavar="DIR", help="policy directory (default: policy.path)")
    if positional:
        parser.add_argument("dir", nargs="?", type=Path, action=Deprecated, instead="--policies DIR", metavar="DIR",
                            help="deprecated: use --policies DIR")
    else:
        parser.add_argument("--dir", type=Path, action=Deprecated, instead="--policies DIR", metavar="DIR",
                            help="deprecated: use --policies DIR")


def given_policies(args: argparse.Namespace) -> Path | None:
    """The policy directory of ``--policies`` or its older spelling (``policies_flag``), ``None`` if neither."""
    policies: Path | None = renamed(args, "policies", "dir", "--policies")
    return policies
