"""Both examples train for one short epoch under the launcher."""

import re
import sys

from .jobs import ROOT, run_job


def test_horovod_style_mnist_example_trains(local_mnist_run):
    result = local_mnist_run
    assert result.returncode == 0, result.stderr
    rank0 = "\n".join(result.lines("stdout", 0))
    assert "Train Epoch: 1" in rank0
    accuracy = float(re.search(r"Accuracy: ([\d.]+)", rank0).group(1))
    assert 0.0 <= accuracy <= 1.0
    assert result.lines("stdout", 1) == []  # rank-0-only logging


def test_ddp_mnist_example_trains():
    result = run_job("run", "-np", "2", sys.executable, str(ROOT / "examples" / "ddp_mnist.py"), "--epochs", "1",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.search(r"Accuracy: [\d.]+", "\n".join(result.lines("stdout", 0)))
