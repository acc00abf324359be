"""The right rank, within the bound, on real jobs: the rank that raised mid-training (a
DistributedOptimizer loop at 3 ranks and a plain DDP loop at 2: each mode and each size once), ranks
that diverged (a deadlock the engines confirm in seconds), a frozen rank under DistributedOptimizer,
and a rank sleeping before a collective (reported one sampling interval after the timeout, with true
durations). Each job leaves nothing behind. ``benchmarks/blame_statistics.py`` runs the same jobs many
times with the machine busy."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from .jobs import python_script, run_job, start_job, wait_until_gone
from .test_hang_detector import _Lines, _summary

FAULT = python_script("fault_in_training.py")


@pytest.mark.parametrize("mode,np", [("optimizer", 3), ("ddp", 2)])
def test_the_rank_that_raised_is_named_whichever_rank_exits_first(mode, np):
    result = run_job("run", "-np", str(np), *FAULT, mode, "raise", timeout=120)
    assert result.returncode == 1, result.stderr
    summary = _summary(result.stderr)
    assert summary.startswith("torchring run: rank 1 (pid ") and \
        "raised ValueError: bad batch at step 20 on rank 1 (fault_in_training.py:" in summary, result.stderr
    assert "on its own" not in result.stderr, result.stderr
    assert wait_until_gone(result.marker) == []


@pytest.mark.parametrize("np,case,expected", [
    (2, "extra", ["rank 0: waiting in allreduce 'grad' (diverge_hvd.py:21), which rank 1 never submitted",
                  "rank 1: waiting in allreduce 'extra' (diverge_hvd.py:20), which rank 0 never submitted",
                  "last collective every rank took part in: allreduce 'grad'"]),
    (3, "reducescatter", ["ranks 0,2: waiting in barrier (diverge_hvd.py:40), which rank 1 never submitted",
                          "rank 1: waiting in reducescatter 'noname.3' (diverge_hvd.py:39), which ranks 0,2 never "
                          "submitted", "last collective every rank took part in: reducescatter 'noname.2'"]),
    (2, "optimizer", ["rank 0: waiting in DistributedOptimizer's allreduce of gradient bucket 'bucket.0.bias' "
                      "(diverge_hvd.py:30)",
                      "rank 1: waiting in allreduce 'loss' (diverge_hvd.py:33), which rank 0 never submitted"]),
])
def test_diverged_ranks_are_called_in_seconds_with_the_diff_and_the_odd_rank_blamed(np, case, expected):
    # these ranks really are deadlocked: a 2 s confirmation (default 5) runs the same watch, verdict and blame
    process, marker = start_job("run", "--horovod-compat", "-np", str(np), *python_script("diverge_hvd.py"), case,
                                env={"TORCHRING_DEADLOCK_TIMEOUT": "2"})
    lines = _Lines(process)
    lines.wait_for(r"\[1\]<stdout>:diverging")
    diverged = time.monotonic()
    returncode = lines.finish(process)
    took = time.monotonic() - diverged
    stderr = lines.text["stderr"]
    assert returncode == 1, stderr
    assert "torchring run: the ranks diverged: each waits for a collective that can never complete (deadlock):" \
        in stderr
    for line in expected:
        assert f"torchring run:   {line}\n" in stderr, stderr
    assert re.search(r"torchring run: rank 1 \(pid \d+ on localhost\) diverged from the other ranks", stderr), stderr
    assert "HorovodInternalError: torchring: the ranks diverged" in stderr  # every rank raised it
    assert "not reached" not in lines.text["stdout"] and took < 20, (took, stderr)
    assert wait_until_gone(marker) == []


def test_the_deadlock_check_can_be_turned_off():
    process, marker = start_job("run", "--horovod-compat", "-np", "2", "--hang-timeout", "3",
                                *python_script("diverge_hvd.py"), "extra", env={"TORCHRING_DEADLOCK_TIMEOUT": "0"})
    lines = _Lines(process)
    assert lines.finish(process) == 1
    stderr = lines.text["stderr"]
    assert "the ranks diverged: each waits" not in stderr and "the job is hung" in stderr, stderr
    assert "probably diverged from the other ranks" in _summary(stderr), stderr  # the hang detector's wording
    assert wait_until_gone(marker) == []


def test_a_frozen_rank_under_distributed_optimizer_is_blamed_at_the_timeout_whatever_its_peer_does():
    process, marker = start_job("run", "-np", "2", "--hang-timeout", "3", *FAULT, "optimizer", "pid", "1", "3")
    lines = _Lines(process)
    pid = int(lines.wait_for(r"\[1\]<stdout>:training rank=1 pid=(\d+)").group(1))
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    returncode = lines.finish(process)
    took = time.monotonic() - stopped
    stderr = lines.text["stderr"]
    assert returncode == 1, stderr
    assert re.search(r"rank 1 \(pid \d+ on localhost\) froze \(process state T, stopped\)", _summary(stderr)), stderr
    assert took < 3 + 2 * 1 + 4, stderr  # the timeout, a sample to see it frozen and one to call it, ending
    assert wait_until_gone(marker) == []


def test_a_rank_sleeping_before_a_collective_is_reported_one_interval_after_the_timeout_with_true_times():
    process, marker = start_job("run", "-np", "2", "--hang-timeout", "3", *FAULT, "allreduce", "sleep", "1", "3")
    lines = _Lines(process)
    lines.wait_for(r"\[1\]<stdout>:sleeping")
    slept = time.monotonic()
    lines.wait_for(r"the job is hung", stream="stderr", timeout=30)
    took = time.monotonic() - slept
    assert lines.finish(process) == 1
    stderr = lines.text["stderr"]
    quiet = int(re.search(r"the job is hung: no rank made progress for (\d+) s \(--hang-timeout 3\)", stderr).group(1))
    assert 3 <= quiet <= 4 and took < 3 + 1 + 2, (took, stderr)  # timeout + one interval (+ output slack)
    unchanged = [int(n) for n in re.findall(r"stack unchanged for (\d+) s", stderr)]
    assert unchanged and all(3 <= n <= 5 for n in unchanged), stderr
    assert "torchring run: rank 1: in train (fault_in_training.py:" in stderr and "got stuck outside any collective" \
        in _summary(stderr), stderr
    assert wait_until_gone(marker) == []
