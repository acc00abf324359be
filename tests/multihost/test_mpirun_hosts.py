"""A real ``mpirun -H h1:2,h2:2`` (Debian's Open MPI) across the namespace hosts: an unchanged script meets
with nothing set by hand; rank 0's address is one of h1's that h2 reaches, agreed over MPI."""

import os
import shutil
import subprocess
import sys

import pytest

from ..integration.test_mpirun import _probes
from .test_multihost_launch import ROOT, assert_hosts_empty

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="no mpirun: install openmpi-bin (.ci/run does)")
PROBE = ROOT / "tests" / "integration" / "scripts" / "mpi_probe.py"
_GIVEN = ("MASTER_ADDR", "MASTER_PORT", "TORCHRING_STORE_ADDR", "TORCHRING_STORE_PORT", "TORCHRING_JOB_SECRET")


def test_mpirun_across_two_hosts_needs_no_variables(cluster):
    env = cluster.env({name: value for name, value in os.environ.items() if name not in _GIVEN})
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    assert MPIRUN is not None
    # the ranks' hosts share this machine's files; the ssh wrapper first in PATH reaches h1 and h2
    result = subprocess.run([MPIRUN, "-np", "4", "-H", "h1:2,h2:2", "-x", "PATH", "-x", "OMP_NUM_THREADS",
                             sys.executable, str(PROBE)], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    probes = _probes(result.stdout)
    assert sorted(probes) == [0, 1, 2, 3], result.stdout + result.stderr
    assert [probes[r]["local"] for r in range(4)] == ["0/2", "1/2", "0/2", "1/2"]
    assert [probes[r]["cross"] for r in range(4)] == ["0/2", "0/2", "1/2", "1/2"]
    assert all(p["sum"] == "6" and p["signed"] == "True" and p["via"] == "MPI" for p in probes.values())
    assert_hosts_empty(cluster)
