"""The operator's edges (issue 8, defects 15-19): listen addresses, ``config validate`` against ``serve``,
the plugin allow-list and start-up log, and the errors a person sees — through ``sidecar.cli.main``,
real ``toolbooth`` processes where the exit code of the process matters, and real servers on real sockets.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sidecar
from sidecar.bootstrap import serve
from sidecar.cli import main
from sidecar.client import AsyncClient
from sidecar.config import Settings, parse_listen, parse_settings
from sidecar.errors import ConfigError
from tests.integration.conftest import StartSidecar
from tests.integration.test_server import FakeGateway
from tests.support.waiting import until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean(clean_env: None) -> None:
    """Every test here runs without the caller's TOOLBOOTH_* variables (``clean_env``)."""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a Unix socket path has at most 107 bytes."""
    path = Path(f"/tmp/tb-edge-{uuid.uuid4().hex[:8]}")
    path.mkdir()
    yield path
    for child in sorted(path.rglob("*"), reverse=True):
        child.unlink() if not child.is_dir() else child.rmdir()
    path.rmdir()


def _config(directory: Path, *lines: str) -> Path:
    path = directory / "toolbooth.yaml"
    path.write_text("\n".join([f"store:\n  sqlite_path: {directory}/tb.db", *lines]) + "\n")
    return path


def _toolbooth(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLBOOTH_")}
    env.update(PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=str(home / "run"), XDG_STATE_HOME=str(home / "state"))
    return subprocess.run([sys.executable, "-m", "sidecar", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def _errors(captured: pytest.CaptureFixture[str]) -> str:
    return captured.readouterr().err


# --- 15: ports --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1:70000", "127.0.0.1:65536", "dns:///127.0.0.1:99999"])
def test_a_port_over_65535_is_refused_by_validate_and_serve(address: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, f"server:\n  listen: ['{address}']")
    port = address.rpartition(":")[2]
    expected = (f"toolbooth: error: config error at server.listen: '{address}': the port {port} is out of range "
                "(1-65535, 0 for any free port)\n")
    assert main(["config", "validate", "--config", str(config)]) == 2
    assert _errors(capsys) == expected
    assert main(["serve", "--listen", address]) == 2
    assert _errors(capsys) == expected


async def test_dns_targets_bind_where_they_point(start_sidecar: StartSidecar,
                                                 make_settings: Callable[..., Settings]) -> None:
    running = await start_sidecar(make_settings(server={"listen": ["dns:///127.0.0.1:0", "ipv4:127.0.0.1:0"]}),
                                  FakeGateway())
    assert [address.startswith("127.0.0.1:") for address in running.addresses] == [True, True]
    for address in running.addresses:
        port = address.rpartition(":")[2]
        for target in (f"dns:///127.0.0.1:{port}", f"ipv4:127.0.0.1:{port}", address):
            async with AsyncClient(target) as client:
                assert (await client.list_tools()).policy_revision == "rev-1"


def test_a_dns_server_or_a_missing_port_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'dns://8\.8\.8\.8/localhost:5000': a DNS server \(8\.8\.8\.8\) means "
                                          r"nothing to a listener; write dns:///HOST:PORT"):
        parse_settings({"server": {"listen": ["dns://8.8.8.8/localhost:5000"]}})
    with pytest.raises(ConfigError, match=r"'dns:///localhost': expected unix:///path or HOST:PORT \(forms: "):
        parse_settings({"server": {"listen": ["dns:///localhost"]}})
    with pytest.raises(ConfigError, match=r"'::1:5000': write an IPv6 address in brackets, e\.g\. \[::1\]:5000"):
        parse_settings({"server": {"listen": ["::1:5000"]}})


# --- 16: unix:path, and the client's hints ----------------------------------------------------------------


async def test_unix_path_forms_bind_and_clients_reach_them(start_sidecar: StartSidecar, short_dir: Path,
                                                           make_settings: Callable[..., Settings],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(short_dir)
    abstract = f"unix-abstract:tb-edge-{uuid.uuid4().hex[:8]}"
    listen = [f"unix:{short_dir}/a.sock", f"unix://{short_dir}/b.sock", "unix:rel.sock", abstract]
    running = await start_sidecar(make_settings(server={"listen": listen}), FakeGateway())
    assert running.addresses == tuple(listen)
    assert {p.name for p in short_dir.iterdir()} == {"a.sock", "b.sock", "rel.sock"}
    assert (short_dir / "a.sock").stat().st_mode & 0o777 == 0o660
    for target in listen:
        async with AsyncClient(target) as client:
            assert (await client.list_tools()).policy_revision == "rev-1"
    await running.stop(None)
    assert list(short_dir.iterdir()) == []


@pytest.mark.parametrize("form", ["unix:{}", "unix://{}"])
def test_the_hint_for_an_absent_socket_is_a_command_that_works(form: str, short_dir: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    target = form.format(short_dir / "absent.sock")
    assert main(["tools", "list", "--target", target]) == 1
    hint = _errors(capsys).splitlines()[-1]
    assert hint.endswith(f"no socket at {short_dir}/absent.sock: is the sidecar running? "
                         f"start it with `toolbooth serve --listen {target}`")
    assert parse_settings({"server": {"listen": [target]}}).server.listen == (target,)  # the hint is valid


# Run as a user the socket does not admit: nobody, when the tests run as root (the modules are imported first,
# every command group's with them, since nobody may not read this interpreter's); the owner itself, with the mode
# set to 0, otherwise.
_STRANGER = """import os, sys
import grpc, sidecar.cli.tools, sidecar.client
from sidecar.cli import main
from sidecar.cli.root import build_parser
build_parser()
if os.geteuid() == 0:
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("closed", ["directory", "socket"])
async def test_a_client_the_socket_does_not_admit_is_told_why_not_shown_a_traceback(
    closed: str, short_dir: Path, start_sidecar: StartSidecar, make_settings: Callable[..., Settings],
) -> None:
    socket = short_dir / "run" / "tb.sock"
    await start_sidecar(make_settings(server={"listen": [f"unix://{socket}"]}), FakeGateway())
    shut = socket.parent if closed == "directory" else socket
    mode = shut.stat().st_mode & 0o777
    socket.parent.chmod(0o755)  # only what is shut stands in the way
    shut.chmod(0)
    env = {name: value for name, value in os.environ.items() if not name.startswith("TOOLBOOTH_")}
    try:
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", _STRANGER, "tools", "list", "--target", f"unix://{socket}"],
            cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60, check=False)
    finally:
        shut.chmod(mode)
    assert done.returncode == 1, done.stderr
    what = f"the directory of {socket}" if closed == "directory" else str(socket)
    assert done.stderr.splitlines()[-1] == (
        f"toolbooth: error: permission denied: this user may not reach {what}; the sidecar makes its socket 0660 "
        "in a 0750 directory: run as its user or in its group")


def test_no_listen_hint_for_a_target_serve_would_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tools", "list", "--target", "unix:" + "x" * 120]) == 1
    assert _errors(capsys).splitlines()[-1].endswith("start it with `toolbooth serve`")


# --- 17: config validate checks what serve checks, exit 2 in both -------------------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    ("auth:\n  jwt: {issuer: i, audience: a, algorithms: [RS256], key_file: DIR/missing.pem}",
     "config error at auth.jwt.key_file: cannot read DIR/missing.pem: No such file or directory"),
    ("auth:\n  jwt: {issuer: i, audience: a, algorithms: [RS256], key: not-a-pem}",
     "config error at auth.jwt: the key fits none of the algorithms RS256"),
    ("policy:\n  path: DIR/no-policies", "config error at policy.path: DIR/no-policies is not a directory"),
    ("policy:\n  bundle: {file: DIR/b.tar.gz}", "config error at policy.bundle.file: DIR/b.tar.gz is not a file"),
    ("audit:\n  mask_key_file: DIR/mask.key", "config error at audit.mask_key_file: cannot read DIR/mask.key"),
    ("audit:\n  chain_key_file: DIR/chain.key",
     "config error at audit.chain_key_file: cannot read DIR/chain.key: No such file or directory"),
])
def test_validate_fails_where_serve_fails_and_both_exit_2(line: str, expected: str, short_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(short_dir, f"server:\n  listen: ['unix://{short_dir}/tb.sock']",
                     line.replace("DIR", str(short_dir)))
    expected = f"toolbooth: error: {expected.replace('DIR', str(short_dir))}"
    assert main(["config", "validate", "--config", str(config)]) == 2
    assert _errors(capsys).startswith(expected)
    assert main(["serve", "--config", str(config)]) == 2
    assert _errors(capsys).splitlines()[-1].startswith(expected)
    assert not (short_dir / "tb.sock").exists() and not (short_dir / "tb.db").exists()


def test_validate_fails_where_serve_fails_for_a_span_exporter_not_installed(
        short_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(short_dir, f"server:\n  listen: ['unix://{short_dir}/tb.sock']")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin_json")
    expected = "toolbooth: error: OTEL_TRACES_EXPORTER='zipkin_json': no such span exporter is installed; installed: "
    assert main(["config", "validate", "--config", str(config)]) == 2
    assert _errors(capsys).startswith(expected)
    assert main(["serve", "--config", str(config)]) == 2
    assert _errors(capsys).splitlines()[-1].startswith(expected)
    assert not (short_dir / "tb.sock").exists() and not (short_dir / "tb.db").exists()


def test_serve_exits_2_as_a_process_for_a_missing_key_file(short_dir: Path) -> None:
    config = _config(short_dir, f"server:\n  listen: ['unix://{short_dir}/tb.sock']",
                     f"auth:\n  jwt: {{issuer: i, audience: a, key_file: {short_dir}/missing.pem}}")
    for command in ("config validate", "serve"):
        done = _toolbooth(*command.split(), "--config", str(config), home=short_dir)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines()[-1] == (f"toolbooth: error: config error at auth.jwt.key_file: cannot read "
                                                f"{short_dir}/missing.pem: No such file or directory")
        assert "Traceback" not in done.stderr


def test_validate_ok_names_what_serve_would_start_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "plugins:\n  allow: [calculator]")
    assert main(["config", "validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "  plugins:  calculator (toolbooth-calculator 1.0.0: calculate)\n" in out
    assert "  tools:    calculate\n" in out
    assert "  policy:   embedded: directory " in out and ", revision sha256:" in out
    assert f"  store:    sqlite {tmp_path}/tb.db, reachable\n" in out
    assert not (tmp_path / "tb.db").exists()  # validate creates nothing


def test_validate_reports_an_unreachable_store_with_exit_1_and_no_password(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = tmp_path / "toolbooth.yaml"
    config.write_text(f"store:\n  postgres_dsn: postgresql://tb:s3cret@127.0.0.1:{port}/tb\n"
                      "  connect_timeout_seconds: 2\n")
    assert main(["config", "validate", "--config", str(config)]) == 1
    err = _errors(capsys)
    where = f"postgresql://tb@127.0.0.1:{port}/tb"
    assert err.startswith(f"toolbooth: error: cannot reach the PostgreSQL store at {where}: ")
    assert "s3cret" not in err


# --- 18: the allow-list and the start-up log ----------------------------------------------------------------


def test_an_unknown_allow_list_entry_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "plugins:\n  allow: [calculator, calcualtor]")
    expected = ("toolbooth: error: config error at plugins.allow: 'calcualtor' matches no installed plugin; "
                "installed toolbooth.tools entry points: ")
    calculator = "calculator (distribution toolbooth-calculator)"  # listed with every other installed plugin
    assert main(["config", "validate", "--config", str(config)]) == 2
    first = _errors(capsys).splitlines()[0]
    assert first.startswith(expected) and calculator in first.removeprefix(expected).split(", ")
    assert main(["serve", "--config", str(config), "--listen", f"unix://{tmp_path}/tb.sock"]) == 2
    assert _errors(capsys).splitlines()[-1] == first


async def test_the_start_up_log_names_plugins_tools_store_policy_and_listeners(
        make_settings: Callable[..., Settings], socket_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = make_settings(server={"listen": [f"unix:{socket_path}"]}, plugins={"allow": ["calculator"]})
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="sidecar.server.app"):
        task = asyncio.create_task(serve(settings, stop=stop))
        try:
            await until(lambda: task.done() or any("listening on" in r.getMessage() for r in caplog.records),
                        timeout=20, what="the start-up log")
            assert not task.done(), task.exception()
        finally:
            stop.set()
            await task
    lines = [r.getMessage() for r in caplog.records if r.name == "sidecar.server.app"]
    assert "plugins: calculator (toolbooth-calculator 1.0.0: calculate)" in lines
    assert "tools: calculate" in lines
    assert f"store: sqlite {settings.store.sqlite_path}" in lines
    policy = next(line for line in lines if line.startswith("policy: "))
    assert policy.startswith("policy: engine embedded, directory ") and ", revision sha256:" in policy
    assert any(line.startswith(f"toolbooth listening on unix:{socket_path} with policy revision sha256:")
               for line in lines)


# --- 19: errors in plain words ------------------------------------------------------------------------------


def test_serve_with_a_policy_source_that_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--policies", "/nope"]) == 2
    assert _errors(capsys) == ("toolbooth: error: --policies /nope: no such policy directory or bundle file "
                               "(or give a bundle URL, http:// or https://)\n")


def test_serve_on_a_tcp_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        assert main(["serve", "--config", str(_config(tmp_path)), "--listen", taken]) == 1
    err = _errors(capsys)
    assert err.splitlines()[-1] == (f"toolbooth: error: cannot listen on {taken}: the port is in use "
                                    "(another process is listening there)")
    assert "Failed to bind" not in err and "GRPC_VERBOSITY" not in err


def test_log_level_in_any_case_and_the_allowed_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_settings({"log_level": "debug"}).log_level == "DEBUG"
    assert parse_settings({"log_level": "Warning"}).log_level == "WARNING"
    assert main(["config", "validate", "--config", str(_config(tmp_path, "log_level: loud"))]) == 2
    assert _errors(capsys) == ("toolbooth: error: config error at log_level: 'loud' is not a log level; "
                               "use one of DEBUG, INFO, WARNING, ERROR (any case)\n")


def test_listen_as_one_string_is_a_list_of_one() -> None:
    assert parse_settings({"server": {"listen": "127.0.0.1:5000"}}).server.listen == ("127.0.0.1:5000",)


def test_env_errors_name_the_key_and_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TOOLBOOTH_SERVER__LISTEN", "127.0.0.1:70000")
    monkeypatch.setenv("TOOLBOOTH_LIMITS__MAX_RESULT_BYTES", "-1")
    assert main(["config", "validate"]) == 2
    assert _errors(capsys).splitlines() == [
        "toolbooth: error: config error at server.listen (from TOOLBOOTH_SERVER__LISTEN): '127.0.0.1:70000': "
        "the port 70000 is out of range (1-65535, 0 for any free port)",
        "toolbooth: error: config error at limits.max_result_bytes (from TOOLBOOTH_LIMITS__MAX_RESULT_BYTES): "
        "Input should be greater than 0",
    ]


def test_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"toolbooth {sidecar.__version__}\n"
    done = _toolbooth("--version", home=tmp_path)
    assert (done.returncode, done.stdout) == (0, f"toolbooth {sidecar.__version__}\n")


def test_args_that_are_not_json_are_a_usage_error_before_any_connection(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["call", "calculate", "--args", '{"operands": [1,\n 2', "--target", f"unix:{tmp_path}/x.sock"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("toolbooth: error: --args is not valid JSON: Expecting ',' delimiter at line 2 column 3 "
                            "(character 19)\n")


def test_every_documented_listen_form() -> None:
    forms = {"unix:/run/x.sock": ("unix", True), "unix:///run/x.sock": ("unix", True), "unix:x.sock": ("unix", True),
             "unix-abstract:tb": ("unix-abstract", True), "127.0.0.1:1": ("tcp", True), "[::1]:1": ("tcp", True),
             "localhost:0": ("tcp", True), "0.0.0.0:65535": ("tcp", False), "dns:localhost:1": ("tcp", True),
             "dns:///[::1]:1": ("tcp", True), "ipv4:127.0.0.1:1,127.0.0.2:2": ("tcp", True),
             "ipv6:[::1]:1": ("tcp", True), "ipv4:10.0.0.1:1": ("tcp", False)}
    for text, (kind, local) in forms.items():
        address = parse_listen(text)
        assert (address.kind.value, address.is_local) == (kind, local), text
    assert parse_listen("ipv4:127.0.0.1:1,127.0.0.2:2").binds == ("127.0.0.1:1", "127.0.0.2:2")
    assert parse_listen("dns:///[::1]:7").binds == ("[::1]:7",)
