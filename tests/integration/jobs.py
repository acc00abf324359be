"""Helpers for tests that start real jobs with ``torchring run`` and inspect what they leave behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
MARKER_VARIABLE = "TORCHRING_TEST_JOB_MARKER"


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    marker: str

    def lines(self, stream: str, rank: int) -> list[str]:
        prefix = f"[{rank}]<{stream}>:"
        text = self.stdout if stream == "stdout" else self.stderr
        return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def processes_with_marker(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries ``marker`` (i.e. processes of that job)."""
    found = []
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if needle in environ.split(b"\0") and "\nState:\tZ" not in status:
            found.append(int(entry.name))
    return found


def wait_until_gone(marker: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = processes_with_marker(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def torchring_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "torchring", *args]


def start_job(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    marker = uuid.uuid4().hex
    # as in an activated venv: "python" is this interpreter (the launcher would otherwise run the ranks with it
    # anyway, and say so, when the python on PATH has no torch: tests/unit/test_command_checks.py)
    path = os.pathsep.join(part for part in (str(Path(sys.executable).parent), os.environ.get("PATH")) if part)
    job_env = {**os.environ, "PATH": path, MARKER_VARIABLE: marker, **(env or {})}
    process = subprocess.Popen(torchring_command(*args), cwd=ROOT, env=job_env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return process, marker


def run_job(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> JobResult:
    process, marker = start_job(*args, env=env)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"job {args} did not finish in {timeout}s\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return JobResult(process.returncode, stdout, stderr, marker)


def python_script(name: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / name)]
