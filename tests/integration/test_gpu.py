"""The CUDA path: NCCL group, CUDA tensors and the demo with --cuda. Skipped without a GPU."""

import sys

import pytest
import torch

from .jobs import ROOT, python_script, run_job

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_collectives_and_optimizer_on_cuda_tensors():
    num_proc = torch.cuda.device_count()
    result = run_job("run", "-np", str(num_proc), *python_script("cuda_collectives.py"))
    assert result.returncode == 0, result.stderr
    for rank in range(num_proc):
        assert f"cuda ok rank={rank} size={num_proc}" in result.lines("stdout", rank)


def test_mnist_example_with_cuda_and_amp():
    num_proc = torch.cuda.device_count()
    result = run_job("run", "-np", str(num_proc), sys.executable, str(ROOT / "examples" / "mnist.py"),
                     "--cuda", "--amp", "--epochs", "2", timeout=600)
    assert result.returncode == 0, result.stderr
    assert "Accuracy" in "\n".join(result.lines("stdout", 0))
