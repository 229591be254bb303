"""The README's quickstart, run verbatim: every command it shows, in order, and the output it says they print.

The commands are the ``sh`` and ``python`` blocks of README.md's "Quickstart" section, run from a fresh
directory that holds only the ``.venv`` of this interpreter and the repository's ``examples/`` (as a clone
does), with a fresh home and the plugins "Set up" installs allowed, and only them
(``TOOLBOOTH_PLUGINS__ALLOW``: another plugin installed in this ``.venv`` is not the reader's): the sidecar of the
"Run" section first, and, where a block starts ``toolbooth serve`` again, that one instead (the reader's first
terminal). The blocks between two of them run in one shell, so a variable set in one block is there in the next
(the reader's second terminal).

What a block prints (stdout and stderr, as a terminal shows them) must match the block that follows it, fenced
as plain or ``json``: an ``…`` stands for any text within its line, a line of only ``…`` for any lines. A
``text`` block is an excerpt and is not compared. A ``python`` block must print what its ``print(...)`` line's
comment says.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.installed import ONLY_BUNDLED
from tests.support.waiting import until_blocking

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SERVE = re.compile(r"^\.venv/bin/toolbooth serve\b.*$", re.MULTILINE)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
START_TIMEOUT = 60.0
SHELL_TIMEOUT = 240.0
ANY = "…"


@dataclass
class Step:
    """A block of commands, and the output it must print (``None``: not compared)."""

    kind: str  # "sh" or "python"
    text: str
    expected: str | None


def section(markdown: str, title: str) -> str:
    """The text of the ``## title`` section."""
    start = markdown.index(f"\n## {title}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start:] if end < 0 else markdown[start:end]


def steps(markdown: str) -> list[Step]:
    """The command blocks of ``markdown`` in order, each with the output block after it, if any."""
    found: list[Step] = []
    for match in FENCE.finditer(markdown):
        language, text = match.group(1), match.group(2)
        if language in ("sh", "python"):
            expected = _print_comment(text) if language == "python" else None
            found.append(Step(language, text, expected))
        elif found and found[-1].kind == "sh" and found[-1].expected is None and language in ("", "json"):
            found[-1].expected = text
    return found


def _print_comment(code: str) -> str | None:
    lines = [line.split("  # ", 1)[1] for line in code.splitlines() if "print(" in line and "  # " in line]
    return "\n".join(lines) + "\n" if lines else None


def pattern(expected: str) -> re.Pattern[str]:
    """``expected`` as a regular expression: ``…`` any text within a line, a line of ``…`` any lines."""
    parts = []
    for line in expected.rstrip("\n").split("\n"):
        if line == ANY:
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(piece) for piece in line.split(ANY)) + r"\n")
    return re.compile("".join(parts))


def test_the_pattern_of_an_output_block() -> None:
    assert pattern('a "…" b\n').fullmatch('a "x y" b\n')
    assert not pattern('a "…" b\n').fullmatch('a "x\ny" b\n')
    assert pattern("first\n…\nlast\n").fullmatch("first\nlast\n")
    assert pattern("first\n…\nlast\n").fullmatch("first\none\ntwo\nlast\n")
    assert not pattern("first\nlast\n").fullmatch("first\nlast\nmore\n")
    assert not pattern("a.b\n").fullmatch("axb\n")


class Reader:
    """The reader's two terminals: a sidecar in the first, one shell per stretch of commands in the second."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLBOOTH_")}
        self.env.update(HOME=str(root / "home"), XDG_RUNTIME_DIR=str(root / "run"),
                        XDG_STATE_HOME=str(root / "home" / ".local" / "state"),
                        **ONLY_BUNDLED)  # the plugins "Set up" installs, whatever else this environment holds
        self.sidecar: subprocess.Popen[bytes] | None = None
        self.socket = root / "run" / "toolbooth" / "toolbooth.sock"
        self.log = root / "serve.log"

    def serve(self, command: str) -> None:
        """Stop the running sidecar (Ctrl-C), start ``command`` and wait until it serves."""
        self.stop()
        with self.log.open("ab") as out:
            self.sidecar = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.root, env=self.env,
                                            stdout=out, stderr=subprocess.STDOUT)
        sidecar = self.sidecar

        def serving() -> bool:
            assert sidecar.poll() is None, f"{command!r} exited:\n{self.log.read_text()}"
            return self.socket.exists() and _serving(f"unix://{self.socket}")

        until_blocking(serving, timeout=START_TIMEOUT, what=f"{command!r} serving")

    def stop(self) -> None:
        if self.sidecar is not None and self.sidecar.poll() is None:
            self.sidecar.send_signal(signal.SIGINT)
            assert self.sidecar.wait(timeout=30) == 0, self.log.read_text()

    def run(self, shell: list[Step]) -> list[str]:
        """Run ``shell``'s blocks in one bash, in order; what each printed."""
        marker = "@@@ block done @@@"
        script = "".join(f"{{\n{_as_shell(step)}\n}} 2>&1\necho\necho '{marker}'\n" for step in shell)
        done = subprocess.run(["bash", "-c", script], cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=SHELL_TIMEOUT, check=False)
        printed = done.stdout.split(f"\n{marker}\n")
        assert len(printed) == len(shell) + 1, f"the shell stopped early:\n{done.stdout}\n{done.stderr}"
        return printed[:-1]


def _as_shell(step: Step) -> str:
    if step.kind == "python":
        return f".venv/bin/python - <<'PY'\n{step.text}PY"
    return step.text.rstrip("\n")


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
def reader() -> Iterator[Reader]:
    root = Path(tempfile.mkdtemp(prefix="tb-readme-", dir="/tmp"))  # short: Unix socket paths are ~107 bytes
    (root / ".venv").symlink_to(sys.prefix)
    (root / "examples").symlink_to(REPO / "examples")
    (root / "home").mkdir()
    reading = Reader(root)
    yield reading
    if reading.sidecar is not None and reading.sidecar.poll() is None:
        reading.sidecar.kill()
        reading.sidecar.wait()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_the_quickstart_works_verbatim(reader: Reader) -> None:
    markdown = README.read_text()
    (run_block,) = [step.text for step in steps(section(markdown, "Run"))]
    quickstart = steps(section(markdown, "Quickstart"))
    assert len(quickstart) >= 10, "the quickstart's blocks were not found"
    reader.serve(run_block.strip())
    shell: list[Step] = []
    for step in quickstart:
        serve = SERVE.search(step.text) if step.kind == "sh" else None
        if serve is None:
            shell.append(step)
            continue
        before = step.text[:serve.start()]
        if before.strip():
            shell.append(Step("sh", before, None))
        _check(shell, reader.run(shell))
        shell = []
        reader.serve(serve.group(0))
    _check(shell, reader.run(shell))
    reader.stop()


def _check(shell: list[Step], printed: list[str]) -> None:
    for step, output in zip(shell, printed, strict=True):
        if step.expected is not None:
            assert pattern(step.expected).fullmatch(output), (
                f"README block\n{step.text}\nprinted\n{output}\ninstead of\n{step.expected}")
