"""``--config`` as the user meets it: client commands find the sidecar a config describes (TCP, TLS), in the order
``--target``, ``$TOOLBOOTH_TARGET``, the config, the default socket; a config's relative paths are read against its
directory; a misspelt key names the one meant. Real ``toolbooth serve`` processes, real ``toolbooth`` commands.

Needs the calculator plugin installed (``pip install -e plugins/calculator --no-deps``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.certificates import Authority
from tests.support.cli import ADD_2_3, Sidecar, short_dir, start_sidecar, toolbooth
from tests.support.inbox import free_port

pytestmark = pytest.mark.integration

ORDER = "--target ADDR, else $TOOLBOOTH_TARGET, else --config FILE ($TOOLBOOTH_CONFIG), else the default socket"


def tcp_config(home: Path, port: int, extra: str = "", name: str = "tcp.yaml") -> Path:
    """A config listening first on loopback TCP ``port``, then on ``home/tb.sock`` (where ``start_sidecar`` waits
    for it); the store in ``home``."""
    path = home / name
    path.write_text(f"server:\n  listen: ['127.0.0.1:{port}', 'unix://{home}/tb.sock']\n{extra}"
                    f"store:\n  sqlite_path: {home}/tb.db\n")
    return path


@pytest.fixture(scope="module")
def tcp_sidecar() -> Iterator[tuple[Sidecar, Path, int]]:
    """One sidecar on loopback TCP for the read-only tests of this module: it, its config and its port."""
    home, port = short_dir(), free_port()
    config = tcp_config(home, port)
    running = start_sidecar(home, home / "tb.sock", "--config", str(config))
    yield running, config, port
    running.stop()
    shutil.rmtree(home, ignore_errors=True)


# --- item 1: client commands read the config --------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ("tools", "list"), ("tools", "export", "--format", "mcp"), ("call", "calculate", "--args", ADD_2_3),
    ("call-batch", "-"), ("previews", "list"), ("policy", "status"),
])
def test_client_commands_reach_the_tcp_sidecar_of_the_config(tcp_sidecar: tuple[Sidecar, Path, int],
                                                               env: dict[str, str], command: tuple[str, ...]) -> None:
    _, config, _ = tcp_sidecar
    stdin = json.dumps([{"tool": "calculate", "arguments": json.loads(ADD_2_3)}]) if "call-batch" in command else None
    done = toolbooth(*command, "--config", str(config), env=env, stdin=stdin)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_toolbooth_config_variable_stands_for_the_flag(tcp_sidecar: tuple[Sidecar, Path, int],
                                                       env: dict[str, str]) -> None:
    _, config, _ = tcp_sidecar
    done = toolbooth("call", "calculate", "--args", ADD_2_3, env={**env, "TOOLBOOTH_CONFIG": str(config)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["data"]["result"] == 5.0


def test_target_then_the_variable_then_the_config(tcp_sidecar: tuple[Sidecar, Path, int], env: dict[str, str],
                                                  home: Path) -> None:
    _, config, port = tcp_sidecar
    absent = f"unix://{home}/absent.sock"
    by_variable = toolbooth("tools", "list", "--config", str(config), env={**env, "TOOLBOOTH_TARGET": absent})
    assert by_variable.returncode == 1
    assert by_variable.stderr.splitlines()[-1] == (
        f"toolbooth: error: the sidecar is looked for at {ORDER}: here $TOOLBOOTH_TARGET; no socket at "
        f"{home}/absent.sock: is the sidecar running? start it with `toolbooth serve --listen {absent}`")
    by_flag = toolbooth("tools", "list", "--config", str(config), "--target", f"127.0.0.1:{port}",
                        env={**env, "TOOLBOOTH_TARGET": absent})
    assert by_flag.returncode == 0, by_flag.stderr


def test_a_listener_on_any_address_is_reached_on_loopback(home: Path, env: dict[str, str]) -> None:
    port = free_port()
    config = tcp_config(home, port, "auth:\n  jwt: {issuer: i, audience: a, algorithms: [HS256], key: "
                                    "a-secret-of-more-than-thirty-two-bytes}\n")
    config.write_text(config.read_text().replace("127.0.0.1:", "0.0.0.0:"))
    running = start_sidecar(home, home / "tb.sock", "--config", str(config))
    try:
        token = toolbooth("token", "--config", str(config), "--subject", "alice", "--tenant", "dev",
                          "--role", "developer", env=env)
        done = toolbooth("call", "calculate", "--args", ADD_2_3, "--config", str(config), "--token",
                         token.stdout.strip(), env=env)
    finally:
        running.stop()
    assert done.returncode == 0, done.stderr


def test_a_config_with_server_tls_is_reached_over_tls(home: Path, env: dict[str, str]) -> None:
    ca = Authority()
    ca.write(home / "tls" / "ca.crt")
    ca.issue("toolbooth").write(home / "tls", "server")
    port = free_port()
    config = tcp_config(home, port, "  tls: {cert_file: tls/server.crt, key_file: tls/server.key}\n")
    running = start_sidecar(home, home / "tb.sock", "--config", str(config))
    try:
        trusted = toolbooth("tools", "list", "--config", str(config), "--tls-ca", str(home / "tls" / "ca.crt"),
                            env=env)
        untrusted = toolbooth("tools", "list", "--config", str(config), env=env)
    finally:
        running.stop()
    assert trusted.returncode == 0, trusted.stderr
    assert untrusted.returncode == 1
    assert "the sidecar's certificate is not trusted: give the CA that signed it with --tls-ca FILE" in \
        untrusted.stderr


def test_nothing_running_names_where_the_sidecar_was_looked_for(home: Path, env: dict[str, str]) -> None:
    default = toolbooth("tools", "list", env=env)
    assert default.returncode == 1
    assert default.stderr.splitlines()[-1] == (
        f"toolbooth: error: the sidecar is looked for at {ORDER}: here the default socket; no socket at "
        f"{home}/run/toolbooth/toolbooth.sock: is the sidecar running? start it with `toolbooth serve`")
    port = free_port()
    config = tcp_config(home, port)
    tcp = toolbooth("tools", "list", "--config", str(config), env=env)
    assert tcp.returncode == 1
    assert tcp.stderr.splitlines()[-1] == (
        f"toolbooth: error: the sidecar is looked for at {ORDER}: here the first server.listen of {config}; "
        f"nothing answers at 127.0.0.1:{port}: is the sidecar running? start it with "
        f"`toolbooth serve --config {config}`")


def test_a_config_listening_on_any_free_port_asks_for_target(home: Path, env: dict[str, str]) -> None:
    done = toolbooth("tools", "list", "--config", str(tcp_config(home, 0)), env=env)
    assert done.returncode == 2
    assert done.stderr == (f"toolbooth: error: the first server.listen of {home}/tcp.yaml: '127.0.0.1:0' listens on "
                           "any free port, which a client cannot know: give --target HOST:PORT\n")


# --- item 6: timeouts, relative paths, misspelt keys, the summary -------------------------------------------


@pytest.mark.parametrize("command", [("call", "calculate", "--args", ADD_2_3), ("call-batch", "-")])
@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_a_timeout_that_is_not_more_than_0_is_a_usage_error(tcp_sidecar: tuple[Sidecar, Path, int],
                                                            env: dict[str, str], command: tuple[str, ...],
                                                            timeout: str) -> None:
    _, config, _ = tcp_sidecar
    done = toolbooth(*command, "--config", str(config), "--timeout", timeout, env=env, stdin="[]")
    assert (done.returncode, done.stdout) == (2, "")
    assert "argument --timeout: " in done.stderr and "DEADLINE_EXCEEDED" not in done.stderr


def test_relative_key_files_are_read_against_the_config_directory(home: Path, env: dict[str, str]) -> None:
    etc = home / "etc"
    (etc / "keys").mkdir(parents=True)
    (etc / "keys" / "hs.key").write_text("a-secret-of-more-than-thirty-two-bytes")
    config = tcp_config(etc, free_port(), "auth:\n  jwt: {issuer: i, audience: a, algorithms: [HS256], "
                                          "key_file: keys/hs.key}\n")
    running = start_sidecar(etc, etc / "tb.sock", "--config", str(config))  # run from the repository
    try:
        token = toolbooth("token", "--config", str(config), "--subject", "alice", "--tenant", "dev",
                          "--role", "developer", env=env)
        assert token.returncode == 0, token.stderr
        done = toolbooth("call", "calculate", "--args", ADD_2_3, "--config", str(config), "--token",
                         token.stdout.strip(), env=env)
    finally:
        running.stop()
    assert done.returncode == 0, done.stderr


def test_a_missing_relative_file_names_the_base_it_was_read_against(home: Path, env: dict[str, str]) -> None:
    config = tcp_config(home, free_port(), "  tls: {cert_file: tls/server.crt, key_file: tls/server.key}\n")
    done = toolbooth("config", "validate", "--config", str(config), env=env)
    assert done.returncode == 2
    assert (f"toolbooth: error: config error at server.tls.key_file: Path does not point to a file "
            f"('tls/server.key' is read against {home}, the directory of the config file)") in done.stderr
    key_file = tcp_config(home, free_port(), "auth:\n  jwt: {issuer: i, audience: a, algorithms: [HS256], "
                                             "key_file: absent.key}\n")
    unread = toolbooth("config", "validate", "--config", str(key_file), env=env)
    assert unread.returncode == 2
    assert f"config error at auth.jwt.key_file: cannot read {home}/absent.key" in unread.stderr


@pytest.mark.parametrize(("text", "error"), [
    ("stroe:\n  sqlite_path: x.db\n", "config error at stroe: unknown key (did you mean 'store'?)"),
    ("server:\n  workres: 2\n", "config error at server.workres: unknown key (did you mean 'workers'?)"),
    ("policy:\n  bundle:\n    file: b.tar.gz\n    verification:\n      keys:\n"
     "        k1: {key: s, algorithem: HS256}\n",
     "config error at policy.bundle.verification.keys.k1.algorithem: unknown key (did you mean 'algorithm'?)"),
    ("limits:\n  surprise: 1\n", "config error at limits.surprise: unknown key\n"),
])
def test_a_misspelt_key_names_the_key_meant(home: Path, env: dict[str, str], text: str, error: str) -> None:
    config = home / "tb.yaml"
    config.write_text(text)
    done = toolbooth("config", "validate", "--config", str(config), env=env)
    assert done.returncode == 2
    assert f"toolbooth: error: {error}" in done.stderr


def test_config_validate_says_workers_metrics_and_the_audit_chain(home: Path, env: dict[str, str]) -> None:
    config = tcp_config(home, free_port())
    text = toolbooth("config", "validate", "--config", str(config), env=env)
    assert text.returncode == 0, text.stderr
    for line in ("  metrics:  off (metrics.listen not set)", "  workers:  1",
                 "  audit:    chain unkeyed (no audit.chain_key)"):
        assert f"\n{line}\n" in text.stdout
    as_json = toolbooth("config", "validate", "--config", str(config), "--output", "json", env=env)
    document = json.loads(as_json.stdout)
    assert (document["metrics"], document["workers"], document["audit_chain"]) == (None, 1, "unkeyed")
