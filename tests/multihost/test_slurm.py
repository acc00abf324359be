"""A real Slurm cluster (Debian's slurmctld, slurmd and munge) on the namespace hosts h1 and h2: ``srun``
starts an unchanged script's ranks, ``torchring run`` inside ``sbatch`` places its ranks on the
allocation's nodes without ``-H``, and a node lost mid-job ends the job with that node named."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import time

from ..integration.test_mpirun import _probes
from .slurm_cluster import SlurmCluster
from .test_multihost_launch import ROOT

PROBE = ROOT / "tests" / "integration" / "scripts" / "mpi_probe.py"
LOOP = ROOT / "tests" / "multihost" / "scripts" / "train_loop.py"
_GIVEN = ("MASTER_ADDR", "MASTER_PORT", "TORCHRING_STORE_ADDR", "TORCHRING_STORE_PORT", "TORCHRING_JOB_SECRET")




def _clean_env(slurm: SlurmCluster, **extra: str) -> dict[str, str]:
    env = slurm.env({name: value for name, value in os.environ.items() if name not in _GIVEN})
    env.update(extra)
    return env


def _on_h1_argv(slurm: SlurmCluster, *argv: str, env: dict[str, str]) -> list[str]:
    """The command that runs ``argv`` on h1 with ``env``'s Slurm, torchring and Python variables exported
    by a script (as a user's shell would have them; the secret is on no command line the test runs)."""
    script = slurm.state_dir / f"job-{secrets.token_hex(4)}.sh"
    exports = "".join(f"export {name}={_quote(value)}\n" for name, value in env.items()
                      if name.startswith(("SLURM_CONF", "PATH", "OMP_", "TORCHRING_", "PYTHON")))
    script.write_text(f"#!/bin/sh\n{exports}cd {ROOT}\nexec \"$@\"\n")
    script.chmod(0o700)
    return slurm.cluster.ssh_command("h1", str(script), *argv)


def _on_h1(slurm: SlurmCluster, *argv: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``argv`` on h1 with ``env`` (see ``_on_h1_argv``) and wait for it."""
    return subprocess.run(_on_h1_argv(slurm, *argv, env=env), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, env=env)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def test_srun_starts_an_unchanged_script_on_two_nodes_with_the_secret_from_the_batch_environment(slurm):
    env = _clean_env(slurm, TORCHRING_JOB_SECRET=secrets.token_hex(32))
    result = _on_h1(slurm, "srun", "-N2", "--ntasks-per-node=2", sys.executable, str(PROBE), env=env)
    assert result.returncode == 0, result.stdout + result.stderr + slurm.logs()
    probes = _probes(result.stdout)
    assert sorted(probes) == [0, 1, 2, 3], result.stdout + result.stderr
    assert [probes[r]["host"] for r in range(4)] == ["h1", "h1", "h2", "h2"]
    assert [probes[r]["local"] for r in range(4)] == ["0/2", "1/2", "0/2", "1/2"]
    assert [probes[r]["cross"] for r in range(4)] == ["0/2", "0/2", "1/2", "1/2"]
    assert all(p["sum"] == "6" and p["via"] == "Slurm" for p in probes.values())
    assert all(p["signed"] == "True" and p["secret_in_env"] == "False" for p in probes.values())
    assert "no TORCHRING_JOB_SECRET" not in result.stderr


def test_srun_without_a_secret_runs_and_rank_0_says_how_to_set_one(slurm):
    result = _on_h1(slurm, "srun", "-N2", "--ntasks-per-node=1", sys.executable, str(PROBE), env=_clean_env(slurm))
    assert result.returncode == 0, result.stdout + result.stderr
    probes = _probes(result.stdout)
    assert sorted(probes) == [0, 1] and all(p["signed"] == "False" for p in probes.values())
    assert result.stderr.count("no TORCHRING_JOB_SECRET") == 1, result.stderr
    assert "export TORCHRING_JOB_SECRET=" in result.stderr


def test_torchring_run_in_sbatch_places_its_ranks_on_the_allocations_nodes(slurm):
    output = slurm.state_dir / f"sbatch-{secrets.token_hex(4)}.out"
    batch = slurm.state_dir / f"batch-{secrets.token_hex(4)}.sh"
    batch.write_text(f"#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m torchring.cli run {sys.executable} {PROBE}\n")
    result = _on_h1(slurm, "sbatch", "--wait", "-N2", "--ntasks-per-node=2", f"--output={output}", str(batch),
                    env=_clean_env(slurm))
    text = output.read_text() if output.exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + text + slurm.logs()
    assert re.search(r"Slurm allocation \d+: h1:2,h2:2 \(SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE\)", text), text
    probes = _probes(text)
    assert sorted(probes) == [0, 1, 2, 3], text
    assert [probes[r]["host"] for r in range(4)] == ["h1", "h1", "h2", "h2"]
    assert all(p["sum"] == "6" and p["signed"] == "True" and p["via"] == "torchring" for p in probes.values())


def test_a_node_lost_mid_job_ends_the_job_with_that_node_named(slurm):
    env = _clean_env(slurm, TORCHRING_JOB_SECRET=secrets.token_hex(32))
    argv = _on_h1_argv(slurm, "srun", "--kill-on-bad-exit=1", "-N2", "--ntasks-per-node=2", sys.executable, str(LOOP),
                       env=env)
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    try:
        training = []
        while len(training) < 4:
            line = process.stdout.readline()
            assert line, process.stderr.read()
            training += [line] if line.startswith("training rank=") else []
        slurm.cluster.kill_all_in("h2")  # its slurmd, the step's slurmstepd and both ranks
        lost_at = time.monotonic()
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0, out + err
    # the survivors' own error names the node and its ranks, not only Gloo's address; srun names it too
    h2 = re.escape(slurm.cluster.host("h2").address)
    # the loss shows in the engine's exchange or in the data collective (an express cycle's, say): both named
    assert re.search(rf"torchring (engine|collective) failed on rank [01]: .*{h2}.*\({h2} is h2 \(ranks 2, 3\)\)",
                     err), err[-3000:]
    assert "Node failure on h2" in err or "h2: task" in err, err[-3000:]
    assert time.monotonic() - lost_at < 90, f"the job took {time.monotonic() - lost_at:.0f} s to end"
