"""A test's real dependency that may be missing: skipped on a developer's machine, a failure in CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """Whether this run is CI's (``CI=true``), where every test must run."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def missing(message: str, *, install: str) -> NoReturn:
    """Skip (or, in CI, fail) a test whose real dependency is absent; ``install`` says how to get it."""
    text = f"{message} ({install})"
    if in_ci():
        pytest.fail(f"{text}; CI=true: this test must run", pytrace=False)
    pytest.skip(text)
