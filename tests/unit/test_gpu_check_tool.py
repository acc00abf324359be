"""tools/gpu-check.sh (``make gpu-check``) on a machine without CUDA: one line saying why, and nothing installed."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gpu-check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a CUDA device here")
def test_gpu_check_stops_with_one_line_when_torch_sees_no_cuda_device():
    venv_gpu = ROOT / ".venv-gpu"
    existed = venv_gpu.exists()
    env = {**os.environ, "GPU_PYTHON": sys.executable}
    result = subprocess.run(["bash", str(TOOL)], cwd=ROOT / "tests", env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode != 0
    lines = (result.stdout + result.stderr).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu-check: torch ") and "sees no CUDA device" in lines[0], lines
    assert sys.executable in lines[0]
    assert "installing" not in lines[0]
    assert existed or not venv_gpu.exists(), "no environment is made before torch is known to see CUDA"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_gpu_check_runs_the_tool_and_installs_no_torch():
    # outside the make that may run this test (make test): its MAKEFLAGS would add "Entering directory" lines
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    dry_run = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env=env)
    assert dry_run.returncode == 0, dry_run.stderr
    assert dry_run.stdout.split() == ["tools/gpu-check.sh"]
    installs = [line for line in TOOL.read_text().splitlines()
                if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs and all("--no-index" in line for line in installs), installs  # never from an index
