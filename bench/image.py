"""The image of one or more commits, built from scratch as docs/operating.md's recipe builds it: size and build time."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support import docker

REPO = Path(__file__).resolve().parents[1]


def measure(daemon: docker.Docker, base: str, commit: str) -> tuple[float, float]:
    """(size in MB, build seconds) of `commit`'s Dockerfile built with no layer cache on `base`."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", commit], capture_output=True, text=True,
                         check=True).stdout.strip()
    tag = f"specwatch-bench:{sha[:12]}"
    with tempfile.TemporaryDirectory(prefix="specwatch-image-") as context:
        subprocess.run(f"git -C {REPO} archive {sha} | tar -x -C {context}", shell=True, check=True)
        started = time.monotonic()
        daemon(*docker._build_command(base, tag=tag), "--no-cache", "--force-rm", context, timeout=1200)
        took = time.monotonic() - started
    size = int(daemon("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
    daemon("image", "rm", tag, check=False)
    return size / 1e6, took


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.image",
        description="Build the image of each COMMIT from scratch (no layer cache; the Debian base made once, as the "
                    "image tests make it) and print its size and how long the build took. The build fetches the "
                    "dependencies from the package index, so its time varies with the index; compare commits measured "
                    "in one run.")
    parser.add_argument("commits", nargs="*", default=["HEAD"], metavar="COMMIT", help="commits to build (default HEAD)")
    args = parser.parse_args(argv)
    with docker.daemon() as daemon:
        base = docker.base_image(daemon)
        for commit in args.commits:
            size, took = measure(daemon, base, commit)
            print(f"{commit}: {size:.1f} MB, built in {took:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
