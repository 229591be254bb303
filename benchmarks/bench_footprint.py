#!/usr/bin/env python
"""The sidecar's footprint: start to SERVING and idle RSS of the real ``toolbooth serve``, against bare grpcio.

    python benchmarks/bench_footprint.py [--repeat 3] [--calls 5] [--idle-seconds 2] [--json]

Each repetition starts, one after the other,

* **baseline**: ``python -c "import grpc"`` (it prints a line once imported and waits): the floor any gRPC
  sidecar in Python starts from;
* **default**: ``python -m sidecar serve`` with the embedded defaults (dev auth, embedded SQLite, in-process
  Rego, the bundled policies, the installed plugins) on a Unix socket, ``log_level: WARNING``;
* **jwt+metrics**: the same with ``auth.mode: jwt`` (RS256, a key made for the run) and ``metrics.listen``.

Start is from the process's spawn to the gRPC health check answering SERVING (polled every ``--poll-ms``; for
the baseline, to its line). Then ``--calls`` ListTools and ExecuteTool calls (with a bearer token for the JWT
sidecar), ``--idle-seconds`` of idling, and the RSS: VmRSS of the process and of every process under it, from
/proc. ``OTEL_*`` and ``TOOLBOOTH_*`` variables are dropped: traces off, the config the file's. Medians of the
repetitions are printed with the targets of issue 27 and whether each is met; ``--json`` puts a document on
stdout and the tables on stderr. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from bench_execute import (
    SERVICE_NAME,
    TARGET_HEADER,
    Children,
    format_rows,
    met,
    progress,
    run_with_children,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sidecar.api.toolbooth.v1 import tool_service_pb2 as pb
from sidecar.api.toolbooth.v1 import tool_service_pb2_grpc as pb_grpc

TARGET_RSS_MB = {"default": 60.0, "jwt+metrics": 75.0}
TARGET_START_S = 0.5
START_TIMEOUT_S = 60.0
ISSUER, AUDIENCE = "https://issuer.example", "toolbooth"
CONFIGS = ("default", "jwt+metrics")
BASELINE_CODE = "import sys, grpc; print('ready', flush=True); sys.stdin.read()"


def tree_rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` and of every process under it, in MB (a process gone meanwhile counts 0)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


def signing_keys() -> tuple[str, str]:
    """A fresh RS256 key pair: (private PEM, public PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


def bearer(private: str) -> str:
    """A token the JWT sidecar accepts for ten minutes."""
    import jwt

    claims = {"sub": "bench", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 600, "tenant": "bench",
              "roles": ["developer"]}
    return jwt.encode(claims, private, algorithm="RS256")


def write_config(tmp: Path, name: str, rep: int, public_key: str) -> tuple[Path, Path]:
    """The config of ``name``'s repetition ``rep`` and the socket it listens on."""
    run = tmp / f"{name.replace('+', '-')}-{rep}"
    run.mkdir()
    socket_path = run / "tb.sock"
    config: dict[str, Any] = {
        "server": {"listen": [f"unix://{socket_path}"]},
        "store": {"sqlite_path": str(run / "state" / "toolbooth.db")},
        "log_level": "WARNING",
    }
    if name == "default":
        config["auth"] = {"mode": "dev"}
    else:
        config["auth"] = {"mode": "jwt", "jwt": {"algorithms": ["RS256"], "issuer": ISSUER, "audience": AUDIENCE,
                                                 "key": public_key}}
        config["metrics"] = {"listen": "127.0.0.1:0"}
    path = run / "sidecar.yaml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path, socket_path


async def serving(target: str) -> bool:
    """Whether the sidecar at ``target`` answers its health check with SERVING (a fresh channel: no back-off)."""
    async with grpc.aio.insecure_channel(target) as channel:
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(request, timeout=1.0)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def wait_serving(children: Children, name: str, socket_path: Path, poll: float) -> None:
    """Poll until SERVING while the child stays alive (at most ``START_TIMEOUT_S``)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (socket_path.exists() and await serving(f"unix://{socket_path}")):
        children.check_alive(name)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not SERVING after {START_TIMEOUT_S:.0f} s:\n{children.log_tail(name)}")
        await asyncio.sleep(poll)


async def some_calls(socket_path: Path, calls: int, token: str | None) -> int:
    """``calls`` ListTools and ExecuteTool calls; how many did not succeed."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    request = pb.ExecuteToolRequest(tool="calculate", arguments_json='{"operation": "add", "operands": [2, 3]}')
    failed = 0
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        stub = pb_grpc.ToolServiceStub(channel)
        for _ in range(calls):
            await stub.ListTools(pb.ListToolsRequest(), metadata=metadata, timeout=10)
            reply = await stub.ExecuteTool(request, metadata=metadata, timeout=10)
            failed += reply.status != pb.STATUS_SUCCESS
    return failed


async def one_sidecar(args: argparse.Namespace, children: Children, name: str, rep: int,
                      keys: tuple[str, str]) -> dict[str, Any]:
    """Start ``name``, time it to SERVING, call it, let it idle, read its RSS, stop it."""
    config, socket_path = write_config(children.tmp, name, rep, keys[1])
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "TOOLBOOTH_"))}
    label = f"{name}-{rep}"
    started = time.perf_counter()
    proc = children.start(label, [sys.executable, "-m", "sidecar", "serve", "--config", str(config)],
                          pdeathsig=True, env=env)
    await wait_serving(children, label, socket_path, args.poll_ms / 1000)
    start_s = time.perf_counter() - started
    failed = await some_calls(socket_path, args.calls, bearer(keys[0]) if name != "default" else None)
    await asyncio.sleep(args.idle_seconds)
    children.check_alive(label)
    rss = tree_rss_mb(proc.pid)
    stop(proc)
    return {"start_s": start_s, "rss_mb": rss, "failed_calls": failed, "log_problems": children.log_problems(label)}


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and wait (the next run starts on a machine without it)."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def baseline(args: argparse.Namespace) -> dict[str, Any]:
    """``python -c "import grpc"``: time to its line, then its RSS after the same idle time."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", BASELINE_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        start_s = time.perf_counter() - started
        if line.strip() != b"ready":
            raise RuntimeError(f"the baseline process said {line!r}")
        await asyncio.sleep(args.idle_seconds)
        return {"start_s": start_s, "rss_mb": tree_rss_mb(proc.pid)}
    finally:
        proc.kill()
        proc.wait()


async def bench(args: argparse.Namespace, children: Children) -> dict[str, Any]:
    """Every repetition of the baseline and the two sidecars, in turns; then the medians."""
    keys = signing_keys()
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], **{name: [] for name in CONFIGS}}
    for rep in range(args.repeat):
        runs["baseline"].append(await baseline(args))
        for name in CONFIGS:
            runs[name].append(run := await one_sidecar(args, children, name, rep, keys))
            progress(f"  {name:12} run {rep + 1}/{args.repeat}: start {run['start_s'] * 1000:6.0f} ms, "
                     f"idle RSS {run['rss_mb']:6.1f} MB")
    summary = {name: {"start_s": statistics.median(r["start_s"] for r in each),
                      "rss_mb": statistics.median(r["rss_mb"] for r in each)} for name, each in runs.items()}
    failures = sum(r["failed_calls"] for name in CONFIGS for r in runs[name])
    problems = [p for name in CONFIGS for r in runs[name] for p in r["log_problems"]]
    return {"settings": {"repeat": args.repeat, "calls": args.calls, "idle_seconds": args.idle_seconds,
                         "poll_ms": args.poll_ms, "cpus": os.cpu_count(), "load_average": os.getloadavg()},
            "runs": runs, "summary": summary, "failures": failures, "log_problems": problems}


def target_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The footprint targets: (target, figure, ratio to the bare grpc process, wanted, met)."""
    summary = results["summary"]
    base = summary["baseline"]
    rows = []
    for name in CONFIGS:
        rss, wanted = summary[name]["rss_mb"], TARGET_RSS_MB[name]
        rows.append((f"idle RSS, {name}", f"{rss:.1f} MB (import grpc {base['rss_mb']:.1f})",
                     f"{rss / base['rss_mb']:.2f}", f"<= {wanted:.0f} MB", met(rss <= wanted)))
    for name in CONFIGS:
        start = summary[name]["start_s"]
        rows.append((f"start to SERVING, {name}", f"{start * 1000:.0f} ms (import grpc {base['start_s'] * 1000:.0f})",
                     f"{start / base['start_s']:.2f}", f"<= {TARGET_START_S} s", met(start <= TARGET_START_S)))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="starts of each process; medians (default: 3)")
    parser.add_argument("--calls", type=int, default=5, help="ListTools + ExecuteTool pairs before idling (default 5)")
    parser.add_argument("--idle-seconds", type=float, default=2.0, help="idle time before RSS is read (default 2)")
    parser.add_argument("--poll-ms", type=float, default=10.0, help="health poll interval (default 10 ms)")
    parser.add_argument("--json", action="store_true", help="a JSON document on stdout (tables on stderr)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.calls < 0 or args.idle_seconds < 0 or args.poll_ms <= 0:
        parser.error("--repeat must be at least 1, --calls and --idle-seconds at least 0, --poll-ms positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run_with_children(bench, args, what="the sidecars")
    if isinstance(results, int):
        return results
    out = sys.stderr if args.json else sys.stdout
    print(f"\nfootprint; medians of {args.repeat} starts; {args.calls} call pairs, then {args.idle_seconds:g} s idle; "
          f"{os.cpu_count()} CPUs; load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=out)
    print(format_rows([TARGET_HEADER, *target_rows(results)]), file=out)
    if results["log_problems"]:
        print(f"server log: {len(results['log_problems'])} error line(s), first: {results['log_problems'][0]}",
              file=out)
    if results["failures"]:
        print(f"FAILURES: {results['failures']} calls did not succeed", file=out)
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
