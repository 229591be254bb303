"""Names that hide OPA's built-ins are refused: by ``toolbooth policy check`` and ``test``, at start and on reload."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.config import PolicySettings, bundled_policy_dir
from sidecar.errors import PolicyLoadError
from sidecar.policy.factory import policy_source
from sidecar.policy.files import checked_files
from sidecar.policy.reload import ReloadingEngine
from tests.support.reloading import rewrite

EXTRA = "package toolbooth.extra\n\nimport rego.v1\n\n"


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundled_policy_dir(), tmp_path / "toolbooth"))


@pytest.mark.parametrize(("rego", "said"), [
    ("time := 1\n", "5: rule 'time' hides OPA's built-in namespace time (time.add_date, time.clock, "
                    "time.date, ...)"),
    ("count(x) := 1\n", "5: function 'count' hides OPA's built-in function count"),
    ("default json := 1\n", "5: rule 'json' hides OPA's built-in namespace json"),
    ("http.timeout := 1\n", "5: rule 'http' hides OPA's built-in namespace http (http.send)"),
    ("plus contains 1 if true\n", "5: rule 'plus' hides OPA's built-in function plus"),
    ("\nimport data.lib.net\n", "6: import 'net' hides OPA's built-in namespace net"),
    ("import data.lib as io\n", "5: import 'io' hides OPA's built-in namespace io"),
])
def test_a_name_hiding_a_builtin_is_refused_naming_file_line_and_builtin(policies: Path, rego: str,
                                                                         said: str) -> None:
    (policies / "extra.rego").write_text(EXTRA + rego)
    with pytest.raises(PolicyLoadError, match=re.escape(f"{policies / 'extra.rego'}:{said}")):
        checked_files(policies)


@pytest.mark.parametrize("rego", ["timeout := 1\n", "internal_recipient(x) := x\n", "times.now := 1\n",
                                  "import data.toolbooth.authz\n"])
def test_other_names_load(policies: Path, rego: str) -> None:
    (policies / "extra.rego").write_text(EXTRA + rego)
    checked_files(policies)


def test_policy_check_and_test_name_the_hiding_rule(policies: Path, capsys: pytest.CaptureFixture[str]) -> None:
    authz = policies / "authz.rego"
    authz.write_text(authz.read_text().replace("internal_recipient(", "internal("))
    line = next(n for n, text in enumerate(authz.read_text().splitlines(), 1) if text.startswith("internal("))
    said = f"{authz}:{line}: function 'internal' hides OPA's built-in namespace internal (internal.member_2, "
    assert main(["policy", "check", str(policies)]) == 1
    assert said in capsys.readouterr().out
    assert main(["policy", "test", str(policies)]) == 2
    assert said in capsys.readouterr().err


def test_a_test_rule_hiding_a_builtin_fails_policy_test(policies: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (policies / "extra_test.rego").write_text(EXTRA.replace("extra", "extra_test") + "sprintf(x) := x\n")
    assert main(["policy", "test", str(policies)]) == 2
    assert f"{policies / 'extra_test.rego'}:5: function 'sprintf' hides" in capsys.readouterr().err


async def test_a_reload_hiding_a_builtin_is_refused_and_says_why(policies: Path) -> None:
    engine = await ReloadingEngine.start(policy_source(PolicySettings(path=policies)))
    first = engine.revision
    rewrite(policies / "extra.rego", EXTRA + "time := 1\n")
    status = await engine.reload_if_changed()
    assert not status.healthy and engine.revision == first
    assert f"{policies / 'extra.rego'}:5: rule 'time' hides OPA's built-in namespace time" in (status.last_error or "")
