"""benchmarks/gpu_check.py, run on the CPU with tiny sizes so that the script itself stays working."""

import sys

from .jobs import ROOT, run_job


def test_gpu_check_script_runs_on_the_cpu():
    result = run_job("run", "-np", "1", sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu",
                     "--batch-size", "2", "--image-size", "32", "--steps", "1", "--rounds", "1", timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.lines("stdout", 0)
    assert any(line.startswith("ResNet-50 bf16 step, batch 2: plain") for line in lines)
    assert any(line.startswith("fusion copy of 161 tensors") for line in lines)
    assert any("200 fused allreduces ok" in line for line in lines)
    assert lines[-1].startswith("gpu_check: targets")
