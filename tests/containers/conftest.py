"""Tests with a real Docker Engine: the image ``make image`` builds, the compose cluster, ``--image`` ranks
and the seed guides' ``docker run`` patterns.

They need ``docker`` answering (``docker info``); without an engine they skip and say why, unless
``TORCHRING_REQUIRE_DOCKER=1`` (set by ``.ci/run``, which installs and starts one), where a missing engine
is a failure. The image is built once per run by ``docker/make_image.sh`` (what ``make image`` runs):
the first run on a machine without registry access also builds the local Debian base (minutes);
later runs reuse it and Docker's build cache. Every container, network and volume a test makes carries
a name with :data:`RUN_ID`, and the session ends by checking that none is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("TORCHRING_TEST_IMAGE", "torchring:cpu")
#: In the names of everything these tests create, so that leftovers can be found and removed.
RUN_ID = f"trtest{uuid.uuid4().hex[:8]}"


def docker(*args: str, timeout: float = 120, check: bool = True, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run the docker client; a failure (with ``check``) fails the test with docker's own message."""
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(f"docker {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def _engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    try:
        result = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "docker info did not answer in 30 s"
    if result.returncode != 0:
        return f"no Docker Engine answers ({(result.stderr or result.stdout).strip().splitlines()[-1:]})"
    return None


@pytest.fixture(scope="session")
def engine() -> None:
    """A Docker Engine that answers, or a skip (a failure where CI asked for one)."""
    problem = _engine_problem()
    if problem is None:
        return
    if os.environ.get("TORCHRING_REQUIRE_DOCKER") == "1":
        pytest.fail(f"TORCHRING_REQUIRE_DOCKER=1 but {problem}")
    pytest.skip(f"{problem}: start dockerd to run the container tests")


def leftovers() -> dict[str, list[str]]:
    """Containers (running or not), networks and volumes of this test run still there."""
    found = {}
    for kind, args in (("containers", ["ps", "-a"]), ("networks", ["network", "ls"]), ("volumes", ["volume", "ls"])):
        names = docker(*args, "--filter", f"name={RUN_ID}", "--format", "{{.Names}}" if kind == "containers"
                       else "{{.Name}}").stdout.split()
        found[kind] = names
    return found


def containers_named(prefix: str) -> list[str]:
    """Names of containers (running or not) whose name starts with ``prefix``."""
    names = docker("ps", "-a", "--filter", f"name={prefix}", "--format", "{{.Names}}").stdout.split()
    return [name for name in names if name.startswith(prefix)]


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    """Poll ``condition()`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def image(engine) -> str:
    """``torchring:cpu``, built by ``docker/make_image.sh`` (what ``make image`` runs) for this checkout."""
    started = time.monotonic()
    result = subprocess.run([str(ROOT / "docker" / "make_image.sh")], cwd=ROOT, capture_output=True, text=True,
                            timeout=1800, env={**os.environ, "IMAGE": IMAGE})
    if result.returncode != 0:
        pytest.fail(f"make image failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}")
    size = int(docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout)
    print(f"\nimage {IMAGE}: {size / 1e6:.0f} MB, make image took {time.monotonic() - started:.0f} s")
    return IMAGE


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    """After every container test: no container, network or volume of this run is left."""
    yield
    if _engine_problem() is not None:
        return
    left = leftovers()
    for name in left["containers"]:
        docker("rm", "-f", name, check=False)
    for name in left["networks"]:
        docker("network", "rm", name, check=False)
    for name in left["volumes"]:
        docker("volume", "rm", "-f", name, check=False)
    assert not any(left.values()), f"the container tests left these behind (now removed): {left}"
