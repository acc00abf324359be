"""A rank that is late, stuck or dead while the others reduce on DistributedOptimizer's bucket lane."""

import re

import pytest

from .jobs import python_script, run_job


def test_late_rank_on_the_lane_gets_a_stall_warning_and_a_dead_one_fails_the_job_with_its_exit_code():
    # one job for two faults in turn: rank 1 late to a step, then gone before the next
    result = run_job("run", "-np", "2", *python_script("lane_stall.py"),
                     env={"LANE_DELAY": "2.5", "LANE_DIE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    warnings = "\n".join(result.lines("stderr", 0))
    assert "gradient bucket 'bucket.0.2.bias'" in warnings, result.stderr
    assert "has waited 1 s for the other ranks" in warnings
    assert "hvd.join()" in warnings
    assert result.lines("stdout", 0)[:1] == ["stepped"], result.stdout
    assert result.lines("stdout", 1) == ["stepped"], result.stdout
    assert result.returncode != 0
    assert "rank 1" in result.stderr and "exited with code 3" in result.stderr, result.stderr


def test_stall_shutdown_time_ends_a_lane_wait_with_an_error():
    result = run_job("run", "-np", "2", *python_script("lane_stall.py"),
                     env={"LANE_DELAY": "30", "HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    assert result.returncode != 0
    out = result.lines("stdout", 0)
    assert len(out) == 1 and out[0].startswith("internal error: gradient bucket 'bucket.0.2.bias'"), result.stdout
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2" in out[0]


@pytest.mark.parametrize("stall_check", ["on", "off"])
def test_a_peer_lost_before_the_lanes_pair_to_it_connected_fails_the_wait_in_seconds(stall_check):
    """Gloo connects a pair on its first collective, and a pair whose peer is gone keeps trying for five
    times the timeout (50 s here). The survivor's lane wait has its idle engine cycle each second instead
    (with the stall check off too): the engine's connection to the dead worker is closed, so the cycle
    fails, the lane wait raises that failure, and the elastic job re-forms in seconds: the first step after
    the loss came 2-4 s after it on a quiet machine, 11 s in a full test run (most of it the replacement
    worker's start-up), where the pair's own retries would take 50 s."""
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "10", "HOROVOD_STALL_CHECK_DISABLE": "1" if stall_check == "off" else "0"}
    result = run_job("run", "--min-np", "2", "--max-np", "2", "-H", "localhost:2", "--elastic-timeout", "30",
                     *python_script("lane_peer_lost.py"), env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exiting instead of launching the first bucket's allreduce" in result.stderr
    recovered = re.search(r"generation 1 trained its first step ([\d.]+) s after the worker lost was seen",
                          result.stderr)
    assert recovered and float(recovered.group(1)) < 25, result.stderr[-3000:]
    assert "Connect timeout" not in result.stderr, result.stderr[-3000:]
    finals = re.findall(r"final rank \d size 2 step 10", result.stdout)
    assert len(finals) == 2, result.stdout


def test_a_joined_ranks_zeros_on_a_pair_to_a_lost_peer_fail_in_seconds():
    """A rank that joined takes part in the others' lane steps with zeros; its first such allreduce opens
    pairs too. The victim exits 2 s into its first lane step, after the joined rank opened the pair to it:
    that wait probes its engine as a training rank's does (before: Gloo's 'Connect timeout' after five
    times the timeout, 49 s here, in 5 of 6 runs), so the job re-forms in seconds (3 s on a quiet machine,
    12 s in a full test run: most of it the replacement worker's start-up)."""
    env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "10", "LANE_JOINER": "w0", "LANE_VICTIM": "w2",
           "LANE_VICTIM_DELAY_S": "2"}
    result = run_job("run", "-np", "3", "--min-np", "2", "--max-np", "3", "-H", "localhost:3", "--elastic-timeout",
                     "30", *python_script("lane_peer_lost.py"), env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "joining after the first step" in result.stderr
    assert "exiting instead of launching the first bucket's allreduce" in result.stderr
    recovered = re.search(r"generation 1 trained its first step ([\d.]+) s after the worker lost was seen",
                          result.stderr)
    assert recovered and float(recovered.group(1)) < 25, result.stderr[-3000:]
    assert "Connect timeout" not in result.stderr, result.stderr[-3000:]
    finals = re.findall(r"final rank \d size 3 step 10", result.stdout)
    assert len(finals) == 3, result.stdout
