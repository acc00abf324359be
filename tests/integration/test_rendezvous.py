"""Rendezvous waits for late ranks up to the start timeout, then names the missing ones."""

import time

from .jobs import python_script, run_job


def test_rank_later_than_the_collective_timeout_still_joins():
    result = run_job("run", "-np", "2", *python_script("late_rank.py"),
                     env={"LATE_RANK_DELAY": "3", "HOROVOD_GLOO_TIMEOUT_SECONDS": "2"})
    assert result.returncode == 0, result.stderr
    assert result.lines("stdout", 0) == ["sum 2.0"]


def test_rank_that_never_arrives_is_named_after_the_start_timeout():
    started = time.monotonic()
    result = run_job("run", "-np", "2", *python_script("late_rank.py"),
                     env={"LATE_RANK_DELAY": "60", "TORCHRING_START_TIMEOUT": "1"})
    assert time.monotonic() - started < 30
    assert result.returncode == 1
    assert "rank(s) [1] of 2 never called hvd.init()" in result.stderr
    assert "torchring run: rank 0 (pid" in result.stderr


def test_a_rank_with_other_shared_engine_values_runs_with_rank_0s():
    """Five ranks (rank 0 answers the meeting, exchanges go through rank 0): rank 2's engine, built before
    the meeting with its own values, is built again with rank 0's, and its first one leaves no thread."""
    result = run_job("run", "-np", "5", *python_script("uneven_engine_settings.py"))
    assert result.returncode == 0, result.stderr
    expected = f"fusion {128 * 1024 * 1024} cache 1024 gather 3 completion-threads 1 sum 5.0"
    for rank in range(5):
        assert result.lines("stdout", rank) == [expected], (rank, result.stdout)
    assert "ranks set different HOROVOD_FUSION_THRESHOLD/HOROVOD_CACHE_CAPACITY" in result.stderr
