"""``sidecar.client`` needs only the API and the contract: an agent process loads no server code."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_SIDE = ("sidecar.server", "sidecar.pipeline", "sidecar.policy", "sidecar.state", "sidecar.cli",
               "sidecar.tools", "sidecar.config")


def test_importing_the_client_loads_nothing_from_the_server_side() -> None:
    code = ("import json, sys, sidecar.client; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sidecar'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert "sidecar.client" in loaded
    assert [m for m in loaded if m in SERVER_SIDE or m.startswith(tuple(f"{p}." for p in SERVER_SIDE))] == []
