"""Docker for the image tests: a daemon (the running one, else one started here), a Debian base image, builds, containers."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import markdown
from tests.support.filelock import held

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specwatch-tests" / "docker"
"""The daemon started here keeps its images (the base above all) under this directory from one run to the next."""
INSTALL_HINT = "install Debian's docker.io and mmdebstrap: apt-get install -y docker.io mmdebstrap"
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
"""The Debian mirrors the recipe's mmdebstrap reads: the host's own."""
RECIPE = markdown.DOCS / "operating.md"
RECIPE_HEADING = "On a host with no registry"


@dataclass(frozen=True)
class Recipe:
    """docs/operating.md's image recipe for a host with no registry (and no bridge network), as a user runs it."""

    base: tuple[str, ...]
    """The shell lines that make the Debian base from Debian's packages and import it, verbatim."""
    base_name: str
    """The name `docker import` gives the base."""
    build: tuple[str, ...]
    """The words of its `docker build` command."""
    daemon_flags: tuple[str, ...]
    """The flags of its `dockerd`, for a host that cannot have Docker's bridge."""
    pip_error: str
    """The error pip gives in a build that reaches no package index, as the page quotes it."""


def recipe() -> Recipe:
    text = markdown.section(RECIPE, RECIPE_HEADING)
    image, daemon_block = (block.strip().splitlines() for block in markdown.blocks(text, "sh"))
    base = tuple(line for line in image if not line.startswith("docker build "))
    [build] = [shlex.split(line) for line in image if line.startswith("docker build ")]
    [imported] = [shlex.split(line) for line in base if line.startswith("docker import ")]
    [dockerd] = [shlex.split(line) for line in daemon_block]
    assert dockerd[0] == "dockerd", dockerd
    [pip_error] = re.findall(r"^\*\*`([^`]+)`\.\*\*", text, flags=re.M)
    return Recipe(base, imported[-1], tuple(build), tuple(dockerd[1:]), pip_error)


def _missing_tools() -> list[str]:
    return [tool for tool in ("docker", "dockerd", "mmdebstrap") if shutil.which(tool) is None]


class Docker:
    """The docker CLI against one daemon, with the classic builder (BuildKit's frontends would have to be pulled)."""

    def __init__(self, host: str | None = None) -> None:
        self.host = host
        self.env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        if host is not None:
            self.env["DOCKER_HOST"] = host

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                                stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def answers(self) -> bool:
        return self("version", "--format", "{{.Server.Version}}", timeout=20, check=False).returncode == 0

    def inspect(self, name: str) -> dict[str, Any]:
        return json.loads(self("inspect", name).stdout)[0]


@contextlib.contextmanager
def daemon(startup_timeout: float = 90) -> Iterator[Docker]:
    """The running Docker daemon if there is one; else a dockerd of our own (data under CACHE), stopped at the end."""
    missing = _missing_tools()
    assert not missing, f"{', '.join(missing)} not found; {INSTALL_HINT}"
    running = Docker()
    if running.answers():
        yield running
        return
    run = CACHE / "run"
    run.mkdir(parents=True, exist_ok=True)
    with held(CACHE / "daemon.lock", timeout=900):  # another run of the image tests waits while this one uses it
        docker = Docker(f"unix://{run / 'docker.sock'}")
        process = None
        if not docker.answers():  # else one a crashed run left behind: use it, leave it
            log = (run / "dockerd.log").open("ab")
            # Its own socket, state and pid file: nothing of a system daemon (/var/run/docker*) is touched.
            process = subprocess.Popen(
                ["dockerd", *recipe().daemon_flags, "--host", docker.host, "--data-root", str(CACHE / "data"),
                 "--exec-root", str(run / "exec"), "--pidfile", str(run / "dockerd.pid")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            log.close()
            deadline = time.monotonic() + startup_timeout
            while not docker.answers():
                tail = "\n".join((run / "dockerd.log").read_text(errors="replace").splitlines()[-20:])
                assert process.poll() is None, f"dockerd exited with {process.returncode}:\n{tail}"
                assert time.monotonic() < deadline, f"dockerd did not answer within {startup_timeout:g}s:\n{tail}"
                time.sleep(0.5)
        try:
            yield docker
        finally:
            if process is not None:
                process.send_signal(signal.SIGTERM)  # dockerd stops its containerd and containers itself
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                # dockerd leaves the bind mount of its network namespace (exec root/netns/default) when it stops: the
                # cache could not be deleted ("Device or resource busy") and each run added one more.
                for point in reversed(mounts_under(run / "exec")):
                    subprocess.run(["umount", point], capture_output=True, check=False)
                left = mounts_under(run / "exec")
                assert not left, f"still mounted after dockerd stopped: {left}"


def mounts_under(root: Path) -> list[str]:
    """The mount points at or under `root`, in the order they were mounted."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(point)
    return found


def base_image(docker: Docker) -> str:
    """The recipe's Debian base, made once by its own commands and kept under a name keyed by them."""
    how = recipe()
    key = json.dumps([how.base, SOURCES.read_text() if SOURCES.is_file() else None])
    name = f"specwatch-test-base:{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if docker("image", "inspect", name, check=False).returncode == 0:
        return name
    assert SOURCES.is_file(), f"the recipe's mmdebstrap reads the Debian mirrors from {SOURCES}, which this machine lacks"
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(how.base)], cwd=work, env=docker.env,
                                capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, f"the base recipe exited {result.returncode}:\n{result.stderr[-3000:]}"
    docker("tag", how.base_name, name)
    docker("image", "rm", how.base_name)  # the recipe's own name goes; the image stays under the keyed one
    return name


def _build_command(base: str, *, tag: str | None, network: str | None = None) -> list[str]:
    """The recipe's `docker build` words after `docker`, on `base`, tagged `tag` (or not), on `network` if given."""
    how = recipe()
    words = list(how.build)
    assert words[:2] == ["docker", "build"] and words[-1] == ".", words
    assert f"BASE_IMAGE={how.base_name}" in words, "the recipe builds on another base than the one it imports"
    words = [f"BASE_IMAGE={base}" if w == f"BASE_IMAGE={how.base_name}" else w for w in words[1:-1]]
    if "-t" in words:
        del words[words.index("-t"):words.index("-t") + 2]
    if network is not None:
        words[words.index("--network") + 1] = network
    return [*words, *(["-t", tag] if tag else [])]


def build(docker: Docker, context: Path, base: str) -> str:
    """Build the repository's Dockerfile as the recipe does, on `base`; the image's ID. One tag per checkout, its
    previous image removed."""
    tag = f"specwatch-test:{hashlib.sha256(str(context.resolve()).encode()).hexdigest()[:12]}"
    previous = docker("image", "inspect", "--format", "{{.Id}}", tag, check=False).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        iid = Path(work) / "iid"
        docker(*_build_command(base, tag=tag), "--iidfile", str(iid), str(context), timeout=900)
        image = iid.read_text().strip()
    if previous and previous != image:
        docker("image", "rm", previous, check=False)  # still in use by a container of another run: it stays
    return image


def build_offline(docker: Docker, context: Path, base: str) -> subprocess.CompletedProcess[str]:
    """The recipe's build with no network at all (`--network none`), as on a bridgeless host without `--network host`;
    from scratch, since the cached layers would need no network."""
    return docker(*_build_command(base, tag=None, network="none"), "--no-cache", "--force-rm", str(context), timeout=600,
                  check=False)


class Container:
    """A detached container; removed with its logs when done."""

    def __init__(self, docker: Docker, image: str, *args: str, options: tuple[str, ...] = ()) -> None:
        self.docker = docker
        self.name = f"specwatch-test-{uuid.uuid4().hex[:12]}"
        docker("run", "--detach", "--name", self.name, *options, image, *args)

    def inspect(self) -> dict[str, Any]:
        return self.docker.inspect(self.name)

    def health(self) -> str:
        return self.inspect()["State"]["Health"]["Status"]

    def logs(self) -> str:
        result = self.docker("logs", self.name)
        return result.stdout + result.stderr

    def remove(self) -> None:
        self.docker("rm", "--force", self.name, check=False)

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
