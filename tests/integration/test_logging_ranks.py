"""``get_logger`` and ``progress`` in a real 2-rank job: rank 0 prints, other ranks only when asked."""

import re
import sys

from .jobs import SCRIPTS, run_job

PREFIX = re.compile(r"^\[rank (\d+) on \S+\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d (\w+) ([\w.]+): (.*)$")


def logged(result, rank):
    """(rank in the prefix, level, logger, message) of each log line rank ``rank`` wrote to stderr."""
    found = []
    for line in result.lines("stderr", rank):
        match = PREFIX.match(line)
        if match:
            found.append((int(match.group(1)), match.group(2), match.group(3), match.group(4)))
    return found


def test_rank_0_logs_and_all_ranks_logger_logs_everywhere():
    result = run_job("run", "-np", "2", sys.executable, str(SCRIPTS / "logging_ranks.py"))
    assert result.returncode == 0, result.stderr
    assert result.lines("stdout", 0) == [] and result.lines("stdout", 1) == []

    rank0, rank1 = logged(result, 0), logged(result, 1)
    assert [(level, name, message) for _, level, name, message in rank0] == [
        ("INFO", "demo", "before init (rank-0 logger)"),
        ("INFO", "demo.all", "before init (all-ranks logger)"),
        ("INFO", "demo", "after init: rank 0 of 2, sum of ranks 1"),
        ("WARNING", "demo.all", "after init: rank 0 says hello"),
    ]
    assert [(level, name, message) for _, level, name, message in rank1] == [
        ("INFO", "demo.all", "before init (all-ranks logger)"),
        ("WARNING", "demo.all", "after init: rank 1 says hello"),
    ]
    assert {rank for rank, *_ in rank0} == {0} and {rank for rank, *_ in rank1} == {1}

    progress0 = [line for line in result.lines("stderr", 0) if line.startswith("demo loop:")]
    assert progress0[-1].startswith("demo loop: step 3/3 (100%) samples/s=")  # 2 samples x 2 ranks per step
    assert not [line for line in result.lines("stderr", 1) if line.startswith("demo loop:")]
