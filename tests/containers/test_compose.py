"""compose.yaml for real: keygen, worker and launcher train examples/mnist.py across two containers over SSH,
with Compose v2 (``docker compose``) and Debian's ``docker-compose`` 1.29, whichever are installed."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from .conftest import ROOT, RUN_ID, docker

ACCURACY_LINE = "Test set: Average loss:"


def _compose_commands() -> list[list[str]]:
    found = []
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        found.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    return found


COMPOSE = _compose_commands()


@pytest.mark.parametrize("compose", COMPOSE or [pytest.param(None, marks=pytest.mark.skip(
    reason="neither `docker compose` (v2) nor docker-compose is installed"))],
    ids=lambda command: " ".join(command or ["none"]))
def test_compose_cluster_trains_across_two_containers_and_down_leaves_nothing(image, compose):
    project = f"{RUN_ID}{len(compose)}"
    base = [*compose, "-p", project, "-f", str(ROOT / "compose.yaml")]
    try:
        result = subprocess.run([*base, "up", "--abort-on-container-exit", "--exit-code-from", "launcher"],
                                cwd=ROOT, capture_output=True, text=True, timeout=600)
        output = result.stdout + result.stderr
        print(output[-3000:])
        assert result.returncode == 0, output[-8000:]
        assert ACCURACY_LINE in output, output[-8000:]
        # the launcher started only once the worker was healthy; its health log shows the passing check
        worker = docker("ps", "-a", "--filter", f"label=com.docker.compose.project={project}",
                        "--filter", "label=com.docker.compose.service=worker", "--format", "{{.Names}}").stdout.split()
        assert len(worker) == 1, worker
        health = json.loads(docker("inspect", "--format", "{{json .State.Health}}", worker[0]).stdout)
        assert any(entry["ExitCode"] == 0 for entry in health["Log"]), health
    finally:
        down = subprocess.run([*base, "down", "-v"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    label = f"label=com.docker.compose.project={project}"
    assert docker("ps", "-a", "--filter", label, "--format", "{{.Names}}").stdout.split() == []
    assert docker("network", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split() == []
    assert docker("volume", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split() == []
