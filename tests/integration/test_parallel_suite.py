"""Runs tests/parallel on every rank of real jobs (Gloo on loopback): all of it at 3 ranks (an odd size,
where uneven splits show), the optimizer, bucket-lane and elastic tests at 2 ranks too, and the checks,
collectives and optimizer at 3 ranks with the steady-state probe off and every cycle exchanged through rank 0
(``TORCHRING_CONTROL_GATHER_RANKS=2``; the all-gather of new requests runs in the first job). (The whole
suite at 2 ranks: ``torchring run -np 2 python -m pytest tests/parallel`` with TORCHRING_PARALLEL_SUITE=1.)"""

from __future__ import annotations

import re
import sys

import pytest

from .jobs import ROOT, run_job, wait_until_gone

PARALLEL = ROOT / "tests" / "parallel"


@pytest.mark.parametrize("num_proc, paths, probe, gather_ranks", [
    (3, [PARALLEL], "1", "0"),
    (2, [PARALLEL / "test_optimizer.py", PARALLEL / "test_gradient_lane.py", PARALLEL / "test_elastic_state.py"], "1",
     "0"),
    # every cycle exchanged in full (TORCHRING_CONTROL_PROBE=0), through rank 0 (as from 16 ranks on by default)
    (3, [PARALLEL / "test_cross_rank_checks.py", PARALLEL / "test_collectives.py", PARALLEL / "test_optimizer.py"],
     "0", "2"),
])
def test_parallel_suite(num_proc, paths, probe, gather_ranks):
    result = run_job("run", "-np", str(num_proc), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "--timeout", "120", *map(str, paths),
                     env={"TORCHRING_PARALLEL_SUITE": "1", "TORCHRING_CONTROL_PROBE": probe,
                          "TORCHRING_CONTROL_GATHER_RANKS": gather_ranks}, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-20000:]
    for rank in range(num_proc):
        summary = [line for line in result.lines("stdout", rank) if re.search(r"\d+ passed", line)]
        assert summary, f"rank {rank} printed no pytest summary"
        assert "failed" not in summary[-1] and "error" not in summary[-1]
    assert wait_until_gone(result.marker) == []
