"""``--horovod-compat`` runs scripts that ``import horovod.torch as hvd`` unchanged."""

import os
import signal
import subprocess
from pathlib import Path

from .jobs import processes_with_marker, python_script, run_job, start_job, wait_until_gone


def test_unchanged_horovod_script_runs_with_horovod_compat():
    result = run_job("run", "-np", "2", "--horovod-compat", *python_script("horovod_style.py"))
    assert result.returncode == 0, result.stderr
    for rank in range(2):
        (line,) = result.lines("stdout", rank)
        assert line.startswith("horovod 0.28.1+torchring") and line.endswith(f"rank {rank} of 2 ok")


def test_without_the_flag_the_shim_is_not_on_the_path():
    result = run_job("run", "-np", "1", *python_script("horovod_style.py"))
    assert "+torchring" not in result.stdout
    if result.returncode != 0:  # no real Horovod installed here
        assert "No module named 'horovod'" in result.stderr


def test_unchanged_horovod_elastic_script_runs_and_resumes_from_its_checkpoint(tmp_path):
    env = {"TORCHRING_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    first = run_job("run", "-np", "2", "--horovod-compat", *python_script("horovod_elastic_style.py"), "2", env=env)
    assert first.returncode == 0, first.stderr
    for rank in range(2):
        assert first.lines("stdout", rank) == [f"rank {rank} starts at epoch 0", f"rank {rank} finished epoch 1"]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["torchring-elastic-state.pt"]

    again = run_job("run", "-np", "2", "--horovod-compat", *python_script("horovod_elastic_style.py"), "3", env=env)
    assert again.returncode == 0, again.stderr
    for rank in range(2):  # the last commit was at the end of epoch 1: the restarted job continues from there
        assert again.lines("stdout", rank) == [f"rank {rank} starts at epoch 1", f"rank {rank} finished epoch 2"]
    assert "resuming from the checkpoint" in again.stderr


def _worker_pid(marker, worker_id):
    """The pid of the job's worker ``worker_id`` (its environment names it)."""
    needle = f"TORCHRING_WORKER_ID={worker_id}".encode()
    for pid in processes_with_marker(marker):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no process of worker {worker_id}")


def test_horovod_synthetic_elastic_benchmark_on_one_host_finishes_after_a_worker_is_killed():
    """-H localhost:2 --min-np 1: a SIGKILLed worker is replaced on its slot (its host still answers); the
    survivor rolls back to its last commit and the job finishes with 2 workers."""
    process, marker = start_job("run", "--horovod-compat", "-H", "localhost:2", "--min-np", "1",
                                "--elastic-timeout", "20", *python_script("horovod_synthetic_elastic.py"), "60")
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if "Running warmup..." in line:
                victim = _worker_pid(marker, "w1")  # found before training runs, killed at its first iteration
            if "Iter #0:" in line:
                os.kill(victim, signal.SIGKILL)
                break
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"the job did not end: {process.communicate()[1][-3000:]}") from None
    stdout = "".join(lines) + stdout
    assert process.returncode == 0, stderr[-3000:]
    assert ("membership changed: 2 -> 2 workers (worker w1 on localhost was killed by signal 9 (SIGKILL); "
            "replacing it on localhost (localhost still answers;") in stderr, stderr[-3000:]
    assert "worker started on localhost" in stderr
    assert "localhost blacklisted" not in stderr and "left the pool" not in stderr
    assert "[w0]<stdout>:Iter #59:" in stdout and "[w0]<stdout>:Total img/sec on 2 CPU(s)" in stdout, stdout[-2000:]
    assert wait_until_gone(marker) == []
