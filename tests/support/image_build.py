"""The image built from the repository's ``Dockerfile`` with buildah, without a Docker daemon or a registry.

Used by ``tests/integration/test_image.py`` and ``benchmarks/bench_image.py``. The builder's base
(``PYTHON_IMAGE``) is the Debian 12 image ``bash .ci/image-tools`` makes (as root) with debootstrap, with the
packages the Dockerfile installs on ``debian:bookworm-slim``; the ``TOOLBOOTH_PYTHON_IMAGE`` variable names another.
The runtime has no base: its root is made of that image's packages in the build. buildah and podman run with the
``containers.conf`` it writes. The build's pip reaches PyPI trusting what this machine trusts: its CA bundle is
mounted into the build's ``RUN`` steps, not copied into the image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["BASE", "ENGINE_ENV", "TARGET_IMAGE_BYTES", "EngineError", "build", "engine", "missing", "python",
           "remove", "size"]

REPO = Path(__file__).resolve().parents[2]
CACHE = Path("/var/cache/toolbooth")
BASE = os.environ.get("TOOLBOOTH_PYTHON_IMAGE", "localhost/toolbooth-python:3.11-bookworm")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
ENGINE_ENV = {**os.environ, "CONTAINERS_CONF": str(CACHE / "containers.conf")}
TARGET_IMAGE_BYTES = 200_000_000  # issue 27: "Image <= 200 MB"
INSTALL = "bash .ci/image-tools"  # as root: what missing() asks for


class EngineError(Exception):
    """buildah or podman failed."""


def engine(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """buildah or podman with this machine's containers.conf; ``EngineError`` if it fails."""
    done = subprocess.run(args, env=ENGINE_ENV, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise EngineError(f"{' '.join(args[:3])}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return done


def missing() -> str | None:
    """What the build needs and this machine lacks (``INSTALL`` makes it), or ``None``."""
    if not all(shutil.which(tool) for tool in ("buildah", "podman", "runc")) \
            or not (CACHE / "containers.conf").exists():
        return "buildah, podman, runc or their containers.conf are missing"
    if subprocess.run(["podman", "image", "exists", BASE], env=ENGINE_ENV, check=False).returncode:
        return f"the base image {BASE} is missing"
    return None


def build(tag: str) -> float:
    """Builds the image as ``tag`` from the repository as it is; the seconds it took."""
    mounts = ["--volume", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.exists() else []
    started = time.monotonic()
    # docker format: an OCI image config has no HEALTHCHECK.
    engine("buildah", "bud", "--isolation", "chroot", "--format", "docker", "--layers=false", "--quiet",
           "--build-arg", f"PYTHON_IMAGE={BASE}", *mounts,
           "--tag", tag, str(REPO), timeout=900)
    return time.monotonic() - started


def size(image: str) -> int:
    """The image's size in bytes as podman reports it: all its layers, uncompressed (the base's included)."""
    document = json.loads(engine("podman", "image", "inspect", image).stdout)
    value = document[0]["Size"]
    assert isinstance(value, int)
    return value


def python(image: str, script: str, *options: str) -> str:
    """``python -c script`` in a throwaway container of ``image`` without network, run with ``options``; its
    stdout (``EngineError`` with its stderr if it fails)."""
    return engine("podman", "run", "--rm", "--network", "none", *options, "--entrypoint", "python", image, "-c",
                  script).stdout


def remove(tag: str) -> None:
    """Removes the image ``tag``, quietly (gone already: nothing to do)."""
    subprocess.run(["podman", "rmi", "--force", tag], env=ENGINE_ENV, capture_output=True, check=False)
