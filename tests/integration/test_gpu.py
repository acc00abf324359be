"""The CUDA path: CUDA tensors through the engine and the lane, checked for values, and the demo with
--cuda. Skipped without a GPU. With one GPU, two ranks share it over Gloo (``TORCHRING_CUDA_BACKEND=gloo``),
so the streams, devices, fusion, join and lane logic still run at two ranks; with more, each rank has its
own GPU and NCCL."""

import sys

import pytest
import torch

from .jobs import ROOT, python_script, run_job

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _layout() -> tuple[int, dict[str, str]]:
    """Ranks and environment: one rank per GPU over NCCL, or two ranks on one GPU over Gloo."""
    gpus = torch.cuda.device_count()
    return (gpus, {}) if gpus >= 2 else (2, {"TORCHRING_CUDA_BACKEND": "gloo"})


def test_collectives_and_optimizer_on_cuda_tensors():
    num_proc, env = _layout()
    result = run_job("run", "-np", str(num_proc), *python_script("cuda_collectives.py"), env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-6000:]
    for rank in range(num_proc):
        assert f"cuda ok rank={rank} size={num_proc}" in result.lines("stdout", rank)


def test_mnist_example_with_cuda_and_amp():
    num_proc, env = _layout()
    result = run_job("run", "-np", str(num_proc), sys.executable, str(ROOT / "examples" / "mnist.py"),
                     "--cuda", "--amp", "--epochs", "2", env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    assert "Accuracy" in "\n".join(result.lines("stdout", 0))
