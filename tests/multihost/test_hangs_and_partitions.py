"""Hangs and partitions across hosts over real SSH: a remote rank stuck in Python is sampled on its host,
named and blamed (a frozen remote rank: ``tests/unit/test_remote_link``); a host cut off by a partition
(nftables drop in its namespace) is named and its ranks end within 10 s; nothing is left on any host."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from .test_multihost_launch import ROOT, SCRIPTS, assert_hosts_empty, launcher

TRAIN = (sys.executable, str(SCRIPTS / "train_loop.py"))


class _Job:
    """A running launcher whose output is collected; ``wait_for`` blocks until a pattern appears."""

    def __init__(self, cluster, *args: str) -> None:
        self.process = subprocess.Popen(launcher(*args), cwd=ROOT, env=cluster.env(dict(os.environ)),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.text = {"stdout": "", "stderr": ""}
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(name,), daemon=True) for name in self.text]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str) -> None:
        for line in getattr(self.process, name):
            with self._changed:
                self.text[name] += line
                self._changed.notify_all()

    def wait_for(self, pattern: str, stream: str = "stdout", timeout: float = 60) -> re.Match:
        with self._changed:
            self._changed.wait_for(lambda: re.search(pattern, self.text[stream]) is not None
                                   or self.process.poll() is not None, timeout)
            match = re.search(pattern, self.text[stream])
        assert match, f"no {pattern!r} in {stream}:\n{self.text}"
        return match

    def finish(self, timeout: float = 60) -> int:
        try:
            returncode = self.process.wait(timeout=timeout)
        finally:
            self.process.kill()
        for reader in self._readers:
            reader.join(timeout=10)
        return returncode


def _summary(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("torchring run: rank ") and "(on h" in line)


def test_a_remote_rank_stuck_in_python_is_sampled_on_its_host_and_blamed(cluster):
    job = _Job(cluster, "-np", "3", "-H", "h1:2,h2:1", "--hang-timeout", "4", "--env", "TR_STUCK_RANK=2", *TRAIN)
    returncode = job.finish(timeout=90)
    stderr = job.text["stderr"]
    print(f"STUCK:\n{stderr}")
    assert returncode == 1, stderr
    assert "torchring run: the job is hung: no rank made progress for 4 s" in stderr
    assert re.search(r"torchring run: ranks 0,1: waiting in allreduce \(train_loop\.py:\d+\)", stderr), stderr
    assert re.search(r"torchring run: rank 2: in stuck_in_data_loading \(train_loop\.py:13\).* — the odd one out",
                     stderr), stderr
    assert "rank 2 (on h2) got stuck outside any collective" in _summary(stderr)
    assert_hosts_empty(cluster)


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft (nftables) is not installed: cannot cut a host off")
def test_a_host_cut_off_by_a_partition_is_named_and_its_ranks_end_within_10_s(cluster):
    job = _Job(cluster, "-np", "2", "-H", "h1:1,h2:1", *TRAIN)
    pid = int(job.wait_for(r"\[1\]<stdout>:training rank=1 pid=(\d+)").group(1))
    cluster.cut_off("h2")
    try:
        cut = time.monotonic()
        while os.path.exists(f"/proc/{pid}") and time.monotonic() - cut < 20:
            time.sleep(0.05)
        ended_after = time.monotonic() - cut
        returncode = job.finish(timeout=60)
    finally:
        cluster.reconnect("h2")
    stderr = job.text["stderr"]
    print(f"PARTITION: rank 1 ended {ended_after:.1f} s after the cut\n{stderr}")
    assert ended_after < 10, f"rank 1 on the cut-off host lived {ended_after:.1f} s after the partition"
    assert returncode != 0, stderr
    assert re.search(r"torchring run: rank 1 \(on h2\) was cut off: no word from h2 for \d+ s \(a network partition",
                     stderr), stderr
    assert_hosts_empty(cluster)
