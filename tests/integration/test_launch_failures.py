"""A collective that fails to start on some ranks after negotiation (tests/integration/scripts/
launch_failure.py plants the fault in the executor, where an out-of-memory error would raise): when every
rank fails alike, each fails its own request and the job goes on; when only rank 1 does, every rank stops
at once with one error naming rank 1 and the cause, instead of rank 0 waiting for the Gloo timeout."""

from __future__ import annotations

import re

from .jobs import python_script, run_job

VERDICT = "'allreduce.only_rank_1' could not start on rank(s) [1] after every rank agreed to run it (rank 1: " \
          "RuntimeError: CUDA out of memory (planted)); rank(s) [0] had started it"


def test_a_collective_only_one_rank_could_start_stops_every_rank_with_its_cause():
    result = run_job("run", "-np", "2", *python_script("launch_failure.py"), timeout=120)
    for rank in (0, 1):
        lines = result.lines("stdout", rank)
        assert any(line.startswith("everyone: HorovodInternalError") and "CUDA out of memory (planted)" in line
                   for line in lines), lines
        assert f"after: {[2.0] * 4}" in lines, lines  # the job went on after a failure every rank shared
        later = next(line for line in lines if line.startswith("later after"))
        assert VERDICT in later, later
        assert float(re.match(r"later after ([0-9.]+) s", later).group(1)) < 10.0  # not the 30 s Gloo timeout
    only = next(line for line in result.lines("stdout", 0) if line.startswith("only_rank_1"))
    assert VERDICT in only, only
