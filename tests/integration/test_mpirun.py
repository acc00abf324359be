"""Ranks started by a real ``mpirun`` (Debian's Open MPI, installed by ``.ci/run``): an unchanged script
meets with nothing set by hand, rank 0's address and a fresh secret travelling through MPI (mpi4py)."""

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from .jobs import ROOT, SCRIPTS

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="no mpirun: install openmpi-bin (.ci/run does)")

#: Open MPI refuses root unless told; the tests run as root in CI. Nothing of torchring's is set.
_ROOT_OK = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
_GIVEN = ("MASTER_ADDR", "MASTER_PORT", "TORCHRING_STORE_ADDR", "TORCHRING_STORE_PORT", "TORCHRING_JOB_SECRET")


def _mpirun(np: int, *command: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in _GIVEN} | _ROOT_OK
    assert MPIRUN is not None
    return subprocess.run([MPIRUN, "--oversubscribe", "-np", str(np), *extra, *command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _probes(stdout: str) -> dict[int, dict[str, str]]:
    """Each rank's probe record, wherever mpirun's relay put it in the output."""
    found = {}
    for record in re.findall(r"PROBE (rank=\d+ .*?secret_in_env=(?:True|False))", stdout):
        fields = dict(re.findall(r"(\w+)=(\S+?)(?= |$)", record))
        found[int(fields["rank"])] = fields
    return found


def test_an_unchanged_script_under_mpirun_meets_with_nothing_set_by_hand():
    result = _mpirun(3, sys.executable, str(SCRIPTS / "mpi_probe.py"))
    assert result.returncode == 0, result.stdout + result.stderr
    probes = _probes(result.stdout)
    assert sorted(probes) == [0, 1, 2], result.stdout
    for rank, probe in probes.items():
        assert probe["size"] == "3" and probe["sum"] == "3" and probe["via"] == "MPI"
        assert probe["local"] == f"{rank}/3" and probe["cross"] == "0/1"
        assert probe["signed"] == "True", "the store's values must be signed with the secret agreed over MPI"
        assert probe["secret_in_env"] == "False", "the secret must not stay in the environment"


def test_a_given_master_address_is_used_as_before():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _mpirun(2, sys.executable, str(SCRIPTS / "mpi_probe.py"),
                     extra=("-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}"))
    assert result.returncode == 0, result.stdout + result.stderr
    probes = _probes(result.stdout)
    assert sorted(probes) == [0, 1] and all(p["sum"] == "1" for p in probes.values())
    assert all(p["signed"] == "False" for p in probes.values()), "no secret was given: integrity only"


def test_without_mpi4py_the_ranks_say_what_to_install_or_set():
    code = "import sys; sys.modules['mpi4py'] = None; import torchring as hvd; hvd.init()"
    result = _mpirun(2, sys.executable, "-c", code)
    assert result.returncode != 0
    # mpirun ends the other rank as soon as one exits with an error, so at least one says it
    assert result.stderr.count("install mpi4py") >= 1, result.stderr
    assert "pip install 'torchring[mpi]'" in result.stderr and "-x MASTER_ADDR=" in result.stderr


def test_an_unchanged_horovod_script_under_mpirun_with_the_shim_installed(tmp_path):
    from torchring.compat import site_shim

    site_shim.install(tmp_path)  # a site directory of the test's own: the suite's environment stays as it is
    script = SCRIPTS / "horovod_style.py"
    start = f"import site, runpy; site.addsitedir({str(tmp_path)!r}); runpy.run_path({str(script)!r})"
    result = _mpirun(2, sys.executable, "-c", start)
    assert result.returncode == 0, result.stdout + result.stderr
    # print() writes the newline apart, so mpirun's relay may join the two ranks' lines
    assert sorted(re.findall(r"horovod \S+ rank (\d) of 2 ok", result.stdout)) == ["0", "1"], result.stdout
