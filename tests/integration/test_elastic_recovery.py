"""Elastic recovery on this host with real training (tests/multihost/scripts/elastic_train.py): a killed
worker's place taken by a hot spare, a killed spare replaced without a reset, and the recovery time on
the launcher's log and its metrics page."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request

import pytest

from ..ports import free_port
from .elastic_jobs import Launcher, random_membership_run, worker_pid
from .jobs import wait_until_gone


def test_a_hot_spare_takes_a_killed_workers_place_and_the_recovery_is_timed_and_exported():
    port = free_port()
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


@pytest.mark.parametrize("seed", [1])
def test_a_random_loss_removal_and_addition_during_real_training(tmp_path, seed):
    """A worker killed, a host removed and one added, in a random order within about a discovery interval,
    on loopback "hosts" (one seed here; benchmarks/elastic_statistics.py runs this 20 times with the machine
    busy, which is where a rare wrong answer shows)."""
    ok, detail = random_membership_run(seed, tmp_path)
    assert ok, detail
