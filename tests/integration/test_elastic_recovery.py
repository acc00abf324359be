"""Elastic recovery on this host with real training (tests/multihost/scripts/elastic_train.py): a killed
worker's place taken by a hot spare, a killed spare replaced without a reset, and the recovery time on
the launcher's log and its metrics page."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

from .jobs import MARKER_VARIABLE, ROOT, start_job, wait_until_gone

SCRIPT = ROOT / "tests" / "multihost" / "scripts" / "elastic_train.py"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def worker_pid(marker: str, worker_id: str) -> int:
    """The pid of elastic worker ``worker_id`` of the job marked ``marker``."""
    wanted = {f"{MARKER_VARIABLE}={marker}".encode(), f"TORCHRING_WORKER_ID={worker_id}".encode()}
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            return int(entry.name)
    raise AssertionError(f"no process of worker {worker_id}")


class Launcher:
    """The launcher's stderr, line by line, as it comes (stdout is collected whole)."""

    def __init__(self, *flags: str, epochs: int = 4) -> None:
        env = {"ELASTIC_LOG": os.devnull, "ELASTIC_STEP_SLEEP": "0.05", "ELASTIC_EPOCHS": str(epochs)}
        self.process, self.marker = start_job("run", *flags, sys.executable, str(SCRIPT), env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.stdout: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(self.process.stderr, self.lines.put), daemon=True),
                        threading.Thread(target=self._read, args=(self.process.stdout, self.stdout.append),
                                         daemon=True)]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, sink) -> None:
        for line in stream:
            sink(line)

    def wait_for(self, pattern: str, timeout: float = 90.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found
        raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(self.seen[-30:]))

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        self.process.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return self.process.returncode, "".join(self.seen)

    def checksums(self) -> dict[int, tuple[int, str]]:
        text = "".join(self.stdout)
        return {int(r): (int(n), c) for r, n, c in re.findall(r"final rank (\d+) size (\d+) checksum (\S+)", text)}


def test_a_hot_spare_takes_a_killed_workers_place_and_the_recovery_is_timed_and_exported():
    port = _free_port()
    job = Launcher("-H", "localhost:4", "--min-np", "2", "--max-np", "3", "--spares", "1",
                   "--metrics-port", str(port), "--metrics-address", "127.0.0.1")
    job.wait_for(r"elastic job started with 3 workers on localhost$")
    spare = job.wait_for(r"hot spare (w\d+) on localhost standing by").group(1)
    while not any("progress epoch 0 batch 5" in line for line in job.stdout):  # training for a while
        time.sleep(0.05)
    os.kill(worker_pid(job.marker, "w1"), signal.SIGKILL)
    job.wait_for(rf"membership changed: 3 -> 3 workers \(worker w1 on localhost was killed by signal 9 .*spare "
                 rf"{spare} on localhost took a place\); generation 1, reset 1")
    seconds = float(job.wait_for(r"generation 1 trained its first step ([\d.]+) s after the worker lost was seen")
                    .group(1))
    assert seconds < 10
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'torchring_elastic_recovery_seconds_count{cause="worker_lost"} 1.0' in page, page[-3000:]
    assert re.search(r'torchring_elastic_last_recovery_seconds\{cause="worker_lost"\} [\d.]+', page)
    assert "torchring_elastic_generation 1.0" in page and "torchring_elastic_members 3.0" in page
    assert "torchring_elastic_resets_total 1.0" in page
    code, log = job.finish()
    assert code == 0, log[-3000:]
    checksums = job.checksums()
    assert sorted(checksums) == [0, 1, 2] and len({c for _, c in checksums.values()}) == 1, checksums
    assert wait_until_gone(job.marker) == []


def test_a_killed_spare_is_replaced_without_a_reset():
    job = Launcher("-H", "localhost:3", "--min-np", "1", "--max-np", "2", "--spares", "1", epochs=2)
    spare = job.wait_for(r"hot spare (w\d+) on localhost standing by").group(1)
    os.kill(worker_pid(job.marker, spare), signal.SIGKILL)
    job.wait_for(rf"hot spare {spare} on localhost was killed by signal 9 .*; starting another spare")
    job.wait_for(r"hot spare w\d+ starting on localhost")
    code, log = job.finish()
    assert code == 0, log[-3000:]
    assert "membership changed" not in log and "0 reset(s)" in log
    assert wait_until_gone(job.marker) == []
