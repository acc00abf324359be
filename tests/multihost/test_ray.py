"""A real Ray cluster (head on h1, a worker node on h2) runs torchring ranks with ``torchring.ray.RayExecutor``."""

from __future__ import annotations

import json
import re

from .test_multihost_launch import ROOT

DRIVER = ROOT / "tests" / "multihost" / "scripts" / "ray_driver.py"
TRAINER = ROOT / "tests" / "multihost" / "scripts" / "ray_trainer.py"




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
