"""Rank 0 warns about operations that only some ranks have submitted."""

from .jobs import python_script, run_job


def test_stalled_operation_is_reported_with_missing_ranks():
    result = run_job("run", "-np", "2", *python_script("stall.py"), env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"})
    assert result.returncode == 0, result.stderr
    warnings = "\n".join(result.lines("stderr", 0))
    assert "late.tensor: waiting for ranks [1]" in warnings
    assert result.lines("stderr", 1) == []
    assert result.lines("stdout", 1) == ["result [2.0, 2.0]"]


def test_stall_check_can_be_disabled():
    result = run_job("run", "-np", "2", *python_script("stall.py"),
                     env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_CHECK_DISABLE": "1"})
    assert result.returncode == 0
    assert "waiting for ranks" not in result.stderr
