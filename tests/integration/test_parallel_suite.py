"""Runs tests/parallel on every rank of real jobs of 2 and 3 ranks (Gloo on loopback)."""

from __future__ import annotations

import re
import sys

import pytest

from .jobs import ROOT, run_job, wait_until_gone


@pytest.mark.parametrize("num_proc", [2, 3])
def test_parallel_suite(num_proc):
    result = run_job("run", "-np", str(num_proc), sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                     "--timeout", "120", str(ROOT / "tests" / "parallel"),
                     env={"TORCHRING_PARALLEL_SUITE": "1"}, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-20000:]
    for rank in range(num_proc):
        summary = [line for line in result.lines("stdout", rank) if re.search(r"\d+ passed", line)]
        assert summary, f"rank {rank} printed no pytest summary"
        assert "failed" not in summary[-1] and "error" not in summary[-1]
    assert wait_until_gone(result.marker) == []
