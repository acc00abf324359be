"""The issue's acceptance check: a shape mismatch errors on every rank within 10 s, then work goes on."""

import re

from .jobs import python_script, run_job


def test_shape_mismatch_errors_everywhere_and_next_allreduce_succeeds():
    result = run_job("run", "-np", "3", *python_script("shape_mismatch.py"))
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        lines = result.lines("stdout", rank)
        error = next(line for line in lines if line.startswith("error after"))
        assert float(re.search(r"after ([\d.]+)s", error).group(1)) < 10
        assert "grad.fc1" in error and "rank 1 sent [6]" in error and "ranks 0,2 sent [4]" in error
        assert "next allreduce: [3.0, 3.0, 3.0, 3.0]" in lines
