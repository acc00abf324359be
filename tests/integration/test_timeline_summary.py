"""``torchring timeline summarize`` on the trace of a real 2-rank job in which rank 1 is late every step."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchring.diagnostics.timeline.cli import main

from .jobs import ROOT

STEPS = 20

SCRIPT = f"""
import time

import torch

import torchring as hvd

hvd.init()
for i in range({STEPS}):
    if hvd.rank() == 1:
        time.sleep(0.05)
    for j in range(2):
        hvd.allreduce(torch.ones(1000), name=f"g{{i}}.{{j}}")
print("done", flush=True)
"""


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{command} did not finish in {timeout}s\nstdout:\n{error.stdout}\nstderr:\n{error.stderr}")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("timeline_summary")
    script = folder / "late_rank1.py"
    script.write_text(textwrap.dedent(SCRIPT))
    path = folder / "timeline.json"
    job = _run([sys.executable, "-m", "torchring.cli", "run", "-np", "2", "--timeline-filename", str(path),
                sys.executable, str(script)], timeout=180)
    assert job.returncode == 0, job.stderr
    assert path.stat().st_size > 0
    return path


def summarize_command(*args: str) -> subprocess.CompletedProcess:
    result = _run([sys.executable, "-m", "torchring.diagnostics.timeline.cli", "summarize", *args], timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def summarize_in_process(capsys, *args: str) -> str:
    """The same command line run in this process (the real command is run once, for the text report)."""
    assert main(["summarize", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_text_names_rank_1_as_the_slowest(trace):
    out = summarize_command(str(trace)).stdout
    assert f"{2 * STEPS} operations" in out
    (line,) = [line for line in out.splitlines() if line.startswith("slowest rank:")]
    assert line.startswith("slowest rank: 1 (last to be ready in "), out
    assert "Top 10 tensors by communication time" in out and "allreduce.g" in out


def test_json_has_slowest_rank_1(trace, capsys):
    data = json.loads(summarize_in_process(capsys, str(trace), "--json", "--top", "3"))
    slowest = data["slowest_rank"]
    assert slowest["rank"] == 1
    assert slowest["last_in_negotiations"] >= STEPS // 2
    assert slowest["wait_caused_s"] > 0.5  # about 50 ms in each of the 20 steps
    assert len(data["tensors"]) == 3
    assert data["negotiations"] == 2 * STEPS
    assert sum(step["ops"] for step in data["steps"]) == 2 * STEPS


def test_plot_writes_a_png(trace, tmp_path, capsys):
    png = tmp_path / "out.png"
    summarize_in_process(capsys, str(trace), "--plot", str(png))
    data = png.read_bytes()
    assert len(data) > 1000
    assert data.startswith(b"\x89PNG\r\n\x1a\n")


OPTIMIZER_SCRIPT = """
import time

import torch

import torchring as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
for step in range(15):
    if hvd.rank() == 1:
        time.sleep(0.05)
    optimizer.zero_grad()
    model(torch.randn(8, 32)).sum().backward()
    optimizer.step()
hvd.shutdown()
"""


def test_the_late_rank_is_found_on_the_optimizers_bucket_lane_too(tmp_path, capsys):
    script = tmp_path / "late_optimizer.py"
    script.write_text(OPTIMIZER_SCRIPT)
    path = tmp_path / "timeline.json"
    job = _run([sys.executable, "-m", "torchring.cli", "run", "-np", "2", "--timeline-filename", str(path),
                sys.executable, str(script)], timeout=180)
    assert job.returncode == 0, job.stderr
    data = json.loads(summarize_in_process(capsys, str(path), "--json"))
    assert data["slowest_rank"]["rank"] == 1, data["slowest_rank"]
    assert "LANE_WAIT" in path.read_text()
