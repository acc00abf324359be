"""``torchring run --image``: every rank in a real container on this host; a killed container, Ctrl-C, and
what is left afterwards (nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from .conftest import ROOT, containers_named, docker, wait_for

ACCURACY_LINE = "Test set: Average loss:"
PREFIX = "torchring-"


def start(image: str, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """Start ``torchring run --image IMAGE ARGS`` from the checkout; its output lines collect in a list."""
    process = subprocess.Popen([sys.executable, "-m", "torchring", "run", "--image", image, *args], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: list[str] = []

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)

    threading.Thread(target=collect, daemon=True).start()
    return process, lines


def job_containers(before: set[str]) -> list[str]:
    return sorted(set(containers_named(PREFIX)) - before)


def test_image_ranks_train_and_leave_no_container(image):
    before = set(containers_named(PREFIX))
    process, lines = start(image, "--verbose", "-np", "2", "python", "examples/mnist.py", "--epochs", "1")
    assert process.wait(timeout=300) == 0, "".join(lines)[-6000:]
    output = "".join(lines)
    assert f"[0]<stdout>:{ACCURACY_LINE}" in output, output[-6000:]
    for rank in range(2):
        assert f"rank {rank} started on localhost (in a container of {image})" in output, output[-6000:]
    wait_for(lambda: not job_containers(before), 30, "the job's containers to be removed")


def test_sigkill_of_a_rank_container_names_that_rank(image):
    before = set(containers_named(PREFIX))
    process, lines = start(image, "-np", "2", "python", "examples/mnist.py", "--epochs", "50")
    try:
        names = wait_for(lambda: len(job_containers(before)) == 2 and job_containers(before), 120,
                         "both rank containers")
        wait_for(lambda: any("Train Epoch" in line for line in lines), 120, "training to start")
        rank1 = next(name for name in names if name.endswith("-rank1"))
        docker("kill", "--signal", "KILL", rank1)
        code = process.wait(timeout=120)
    finally:
        process.kill()
    output = "".join(lines)
    assert code != 0, output[-6000:]
    summary = [line for line in lines if line.startswith("torchring run: rank 1 ")]
    assert summary, output[-6000:]
    assert "was killed by signal 9 (SIGKILL)" in summary[0], summary[0]  # the container's exit status 137
    wait_for(lambda: not job_containers(before), 60, "every container of the job to be gone")


def test_ctrl_c_stops_every_container(image):
    before = set(containers_named(PREFIX))
    process, lines = start(image, "-np", "2", "python", "examples/mnist.py", "--epochs", "50")
    try:
        wait_for(lambda: len(job_containers(before)) == 2, 120, "both rank containers")
        wait_for(lambda: any("Train Epoch" in line for line in lines), 120, "training to start")
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
    finally:
        process.kill()
    assert code == 128 + signal.SIGINT, "".join(lines)[-6000:]
    wait_for(lambda: not job_containers(before), 60, "every container of the job to be gone")
