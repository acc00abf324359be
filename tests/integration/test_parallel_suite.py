"""Runs tests/parallel on every rank of real jobs (Gloo on loopback): all of it at 3 ranks (an odd size,
where uneven splits show), the optimizer, bucket-lane and elastic tests at 2 ranks too, and the checks,
collectives and optimizer at 3 ranks with the steady-state probe off (every cycle an all-gather). (The whole
suite at 2 ranks: ``torchring run -np 2 python -m pytest tests/parallel`` with TORCHRING_PARALLEL_SUITE=1.)"""

from __future__ import annotations

import re
import sys

import pytest

from .jobs import ROOT, run_job, wait_until_gone

PARALLEL = ROOT / "tests" / "parallel"


@pytest.mark.parametrize("num_proc, paths, probe", [
    (3, [PARALLEL], "1"),
    (2, [PARALLEL / "test_optimizer.py", PARALLEL / "test_gradient_lane.py", PARALLEL / "test_elastic_state.py"], "1"),
    # the all-gather alone (TORCHRING_CONTROL_PROBE=0), as every cycle ran before the probe
    (3, [PARALLEL / "test_cross_rank_checks.py", PARALLEL / "test_collectives.py", PARALLEL / "test_optimizer.py"],
     "0"),
])
def test_parallel_suite(num_proc, paths, probe):
    result = run_job("run", "-np", str(num_proc), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "--timeout", "120", *map(str, paths),
                     env={"TORCHRING_PARALLEL_SUITE": "1", "TORCHRING_CONTROL_PROBE": probe}, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-20000:]
    for rank in range(num_proc):
        summary = [line for line in result.lines("stdout", rank) if re.search(r"\d+ passed", line)]
        assert summary, f"rank {rank} printed no pytest summary"
        assert "failed" not in summary[-1] and "error" not in summary[-1]
    assert wait_until_gone(result.marker) == []
