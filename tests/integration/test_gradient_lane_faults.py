"""A rank that is late, stuck or dead while the others reduce on DistributedOptimizer's bucket lane."""

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
