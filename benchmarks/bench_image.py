#!/usr/bin/env python
"""The image's size: the Dockerfile built as tests/integration/test_image.py builds it, against issue 27's target.

    python benchmarks/bench_image.py [--keep] [--json]

Builds the image with buildah from the repository as it is (``tests/support/image_build.py``: the builder's base
is the Debian 12 image ``bash .ci/image-tools`` makes, as root, with what the Dockerfile installs on
``debian:bookworm-slim``; a minute or two, PyPI through pip's index), reads its size as podman reports it (every
layer, uncompressed: what ``docker images`` shows), what its virtualenv and its ``site-packages`` hold, then removes
it (``--keep``: leaves it tagged). One row against the target of 200 MB. The image has no base: its root is made
of Debian 12 packages in the build, so its size is that of a build from the Dockerfile's defaults (but for the
packages' point releases).

One build: its size does not vary with timing (``targets.py`` gives it no ``--repeat``). ``--json`` puts a document
on stdout and the tables on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.support

from bench_execute import TARGET_HEADER, format_rows, met, progress

from tests.support import image_build

# Run in the image (read-only, no network, as its user): the virtualenv's bytes, and what site-packages holds, by
# kind and by top entry.
CONTENTS = """
import json, os, sys, sysconfig
def total(top):
    return sum(os.lstat(os.path.join(where, name)).st_size for where, _, names in os.walk(top) for name in names)
root = sysconfig.get_paths()["purelib"]
kinds, entries = dict.fromkeys(("native", "source", "bytecode", "metadata", "other"), 0), {}
for directory, _, names in os.walk(root):
    relative = os.path.relpath(directory, root)
    for name in names:
        path = os.path.join(directory, name)
        if os.path.islink(path):
            continue
        size, entry = os.path.getsize(path), name if relative == "." else relative.split(os.sep)[0]
        if entry.endswith(".dist-info"):
            kind = "metadata"
        elif name.endswith(".so") or ".so." in name:
            kind = "native"
        elif name.endswith(".py"):
            kind = "source"
        elif name.endswith(".pyc"):
            kind = "bytecode"
        else:
            kind = "other"
        kinds[kind] += size
        entries[entry] = entries.get(entry, 0) + size
largest = dict(sorted(entries.items(), key=lambda item: -item[1])[:12])
print(json.dumps({"virtualenv_bytes": total(sys.prefix), "site_packages": root, "kinds": kinds,
                  "largest": largest}))
"""


def contents(image: str) -> dict[str, Any]:
    """What the image's site-packages holds (``CONTENTS``)."""
    done = image_build.engine("podman", "run", "--rm", "--read-only", "--network", "none", "--entrypoint", "python",
                              image, "-c", CONTENTS)
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def bench(keep: bool) -> dict[str, Any]:
    """Build, measure, remove (unless ``keep``)."""
    tag = f"localhost/toolbooth-bench:{uuid.uuid4().hex[:12]}"
    progress(f"building {tag} (PYTHON_IMAGE={image_build.BASE})")
    try:
        build_s = image_build.build(tag)
        size, inside = image_build.size(tag), contents(tag)
    finally:
        if not keep:
            image_build.remove(tag)
    return {"image": tag if keep else None, "build_s": build_s, "builder": image_build.BASE, "bytes": size,
            "target_bytes": image_build.TARGET_IMAGE_BYTES, **inside}


def target_rows(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """The image-size target: (target, figure, ratio to the target, wanted, met)."""
    target, total, virtualenv = results["target_bytes"], results["bytes"], results["virtualenv_bytes"]
    figure = f"{total / 1e6:.1f} MB (virtualenv {virtualenv / 1e6:.1f}, the rest {(total - virtualenv) / 1e6:.1f})"
    return [("image size", figure, f"{total / target:.2f} of target", f"<= {target / 1e6:.0f} MB",
             met(total <= target))]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="leave the image tagged (its tag is in the report)")
    parser.add_argument("--json", action="store_true", help="a JSON document on stdout (tables on stderr)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if lacking := image_build.missing():
        print(f"{lacking}: run {image_build.INSTALL} (as root)", file=sys.stderr)
        return 2
    try:
        results = bench(args.keep)
    except image_build.EngineError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    out = sys.stderr if args.json else sys.stdout
    print(f"\nimage size; built in {results['build_s']:.0f} s; podman's size: every layer, uncompressed", file=out)
    print(format_rows([TARGET_HEADER, *target_rows(results)]), file=out)
    kinds = ", ".join(f"{kind} {size / 1e6:.1f}" for kind, size in results["kinds"].items())
    print(f"\n{results['site_packages']}: {sum(results['kinds'].values()) / 1e6:.1f} MB ({kinds} MB)", file=out)
    print(format_rows([("largest entries", "MB"), *((name, f"{size / 1e6:.1f}")
                                                    for name, size in results["largest"].items())]), file=out)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
