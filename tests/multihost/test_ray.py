"""A real Ray cluster (head on h1, a worker node on h2) runs torchring ranks with ``torchring.ray.RayExecutor``."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from .test_multihost_launch import ROOT

DRIVER = ROOT / "tests" / "multihost" / "scripts" / "ray_driver.py"
TRAINER = ROOT / "tests" / "multihost" / "scripts" / "ray_trainer.py"
ELASTIC = ROOT / "tests" / "multihost" / "scripts" / "ray_elastic.py"


def test_ray_executor_places_two_workers_per_host_and_their_ranks_meet(ray_cluster):
    result = ray_cluster.driver([str(DRIVER)])
    assert result.returncode == 0 and "DONE" in result.stdout, result.stdout + result.stderr[-4000:]
    ranks = [json.loads(line[5:]) for line in result.stdout.splitlines() if line.startswith("RANK ")]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    hosts = [r["host"] for r in ranks]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3] and set(hosts) == {"h1", "h2"}
    assert [r["local"] for r in ranks] == [[0, 2], [1, 2], [0, 2], [1, 2]]
    assert [r["cross"] for r in ranks] == [[0, 2], [0, 2], [1, 2], [1, 2]]
    assert all(r["size"] == 4 and r["sum"] == 6 for r in ranks)
    assert all(r["signed"] and not r["secret_in_env"] for r in ranks)
    assert "SCALES [3, 3, 3, 3]" in result.stdout and "SINGLE 6" in result.stdout


def test_hvd_init_inside_a_torch_trainer_worker_joins_the_group_ray_made(ray_cluster, tmp_path):
    result = ray_cluster.driver([str(TRAINER), str(tmp_path / "results")])
    assert result.returncode == 0 and "FIT ok" in result.stdout, result.stdout[-4000:] + result.stderr[-4000:]
    found = {}
    for rank, size, total, ddp, host in re.findall(r"HVD rank=(\d) size=(\d) sum=(\d+) ddp=(\d+) host=(\w+)",
                                                   result.stdout):
        found[int(rank)] = (int(size), int(total), int(ddp), host)
    assert sorted(found) == [0, 1], result.stdout[-4000:]
    assert all(value[:3] == (2, 1, 2) for value in found.values())
    assert {value[3] for value in found.values()} == {"h1", "h2"}  # STRICT_SPREAD: one worker per node


def _progress_reaches(progress: Path, driver: subprocess.Popen, size: int, step: int, timeout: float = 120) -> dict:
    """Poll rank 0's progress file until the job runs at ``size`` ranks and has reached ``step``."""
    deadline = time.monotonic() + timeout
    seen: dict = {}
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"the driver ended early: {driver.communicate()}"
        try:
            seen = json.loads(progress.read_text())
        except (OSError, ValueError):
            seen = {}
        if seen.get("size") == size and seen.get("step", 0) >= step:
            return seen
        time.sleep(0.1)
    driver.kill()
    raise AssertionError(f"no progress to size {size}, step {step} within {timeout:g} s (last: {seen}); driver "
                         f"output: {driver.communicate()}")


def test_elastic_ray_executor_survives_a_lost_node_and_names_it(ray_cluster, tmp_path):
    """Four workers (2 slots on each node); the node h2 is killed with its raylet and actors mid-training;
    the two workers on h1 roll back to their last commit and finish as a job of 2, with the node named."""
    progress, finish = tmp_path / "progress", tmp_path / "finish"
    driver = ray_cluster.start_driver([str(ELASTIC), str(progress), str(finish)])
    try:
        _progress_reaches(progress, driver, size=4, step=5)
        ray_cluster.kill_node("h2")
        lost = time.monotonic()
        after = _progress_reaches(progress, driver, size=2, step=1)
        recovered_s = time.monotonic() - lost
        _progress_reaches(progress, driver, size=2, step=after["step"] + 3)
        finish.touch()
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, stdout[-3000:] + stderr[-6000:]
    results = [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in results) == [0, 1], stdout + stderr[-4000:]
    assert all(r["size"] == 2 and r["host"] == "h1" and r["sizes"] == [4, 2] for r in results), results
    assert results[0]["step"] == results[1]["step"] and results[0]["weights"] == results[1]["weights"]
    h2 = ray_cluster.cluster.host("h2").address
    assert re.search(rf"its Ray node {re.escape(h2)} died", stderr), stderr[-6000:]
    assert re.search(r"membership changed: 4 -> 2 workers", stderr), stderr[-6000:]
    assert "RESETS 1" in stdout, stdout[-1500:] + stderr[-6000:]
    print(f"the job went on at 2 ranks {recovered_s:.1f} s after the node was killed")
