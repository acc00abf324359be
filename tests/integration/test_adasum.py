"""``op=hvd.Adasum`` across real ranks: a 4-rank job checks allreduce, grouped allreduce, fp16 and
``DistributedOptimizer(op=Adasum)`` against the single-process reference on 4 ranks and on process sets
of 2 and 3 (tests/integration/scripts/adasum_check.py); the MNIST example trains with ``--use-adasum``
to the accuracy band of Average."""

from __future__ import annotations

import re
import sys

from .jobs import ROOT, python_script, run_job


def test_adasum_matches_the_reference_at_2_3_and_4_ranks():
    result = run_job("run", "-np", "4", *python_script("adasum_check.py"), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    assert sorted(re.findall(r"\[(\d)\]<stdout>:ADASUM OK (\d+)", result.stdout)) == [
        ("0", "12"), ("1", "12"), ("2", "9"), ("3", "6")], result.stdout[-3000:]


def _mnist_accuracy(*flags: str) -> float:
    result = run_job("run", "-np", "2", sys.executable, str(ROOT / "examples" / "mnist.py"), "--epochs", "3",
                     "--lr", "0.05", "--log-interval", "100", *flags, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    return float(re.findall(r"Accuracy: ([0-9.]+)", result.stdout)[-1])


def test_the_mnist_example_trains_with_adasum_to_the_band_of_average():
    """Adasum keeps the single-rank learning rate, Average scales it by the ranks (Horovod's example);
    measured here: 0.83 and 0.86 after 3 epochs."""
    adasum, average = _mnist_accuracy("--use-adasum"), _mnist_accuracy()
    assert adasum >= 0.7 and average >= 0.7 and abs(adasum - average) <= 0.1, (adasum, average)
