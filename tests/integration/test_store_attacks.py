"""An attacker that reaches a running job's store and writes forged values: nothing it writes runs,
changes a result, moves the blame or ends an elastic job (issue 15; see docs/security.md)."""

import os
import pickle
import re
import subprocess
import sys

import pytest
import torch.distributed as dist

import torchring
from torchring.contract import FUNCTION_KEY, JOB_SECRET, RANK, SIZE, STORE_ADDR, STORE_PORT
from torchring.launch.function_job import FunctionJobError
from torchring.launch.rendezvous import RendezvousServer

from .jobs import ROOT, python_script, run_job


class CreatesFile:
    """A pickle that, when loaded, creates a file: what an attacker's payload would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_forged_function_payload_is_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    server = RendezvousServer()
    server.store.set(FUNCTION_KEY, pickle.dumps(CreatesFile(str(marker))))  # unsigned, as an attacker writes it
    env = {**os.environ, RANK: "0", SIZE: "1", STORE_ADDR: "127.0.0.1", STORE_PORT: str(server.port),
           **server.credentials.environment()}
    rank = subprocess.run([sys.executable, "-m", "torchring.launch.function_rank"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert rank.returncode == 1
    assert "not signed with the job's secret" in rank.stderr and "was not unpickled" in rank.stderr
    assert not marker.exists()


def _overwrite_rank0_result(marker: str) -> int:
    """Rank 1 acts as the attacker: once rank 0 has put its result, it replaces it with a pickle."""
    import os
    import pickle
    from datetime import timedelta


    if os.environ["TORCHRING_RANK"] == "0":
        return 42
    attacker = dist.TCPStore(os.environ["TORCHRING_STORE_ADDR"], int(os.environ["TORCHRING_STORE_PORT"]),
                             is_master=False, timeout=timedelta(seconds=30))
    attacker.wait(["torchring/function/result/0"])
    attacker.set("torchring/function/result/0", pickle.dumps(CreatesFile(marker)))
    return 43


def test_a_forged_result_is_never_unpickled_and_torchring_run_says_so(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(FunctionJobError, match=r"result of rank\(s\) \[0\].*not signed with the job's secret"):
        torchring.run(_overwrite_rank0_result, args=(str(marker),), np=2)
    assert not marker.exists()


def test_a_forged_peer_failure_record_does_not_move_the_blame():
    result = run_job("run", "-np", "2", *python_script("forge_peer_failure.py"), timeout=60)
    assert result.returncode == 3, result.stderr
    assert "torchring run: rank 1 (" in result.stderr
    assert "ignoring the value of 'torchring/peer_failure/1'" in result.stderr


def test_an_elastic_job_goes_on_after_a_forged_hosts_version():
    result = run_job("run", "--min-np", "1", "--max-np", "1", "-H", "localhost:1",
                     *python_script("forge_hosts_version.py"), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "COMMITTED 2" in result.stdout
    assert "ignoring the value of 'torchring/elastic/hosts_version'" in result.stderr


def test_the_secret_is_on_no_command_line_and_not_inherited_after_init(tmp_path):
    """Each rank looks for its secret in every process's command line, then starts a child after init."""
    code = f"""
import os, pathlib, subprocess, sys
import torchring as hvd
secret = os.environ[{JOB_SECRET!r}]
assert len(secret) == 64
def command_line(process):
    try:
        return (process / 'cmdline').read_bytes()
    except OSError:  # the process ended meanwhile
        return b''
seen = [p.name for p in pathlib.Path('/proc').iterdir() if p.name.isdigit() and secret.encode() in command_line(p)]
hvd.init()
check = 'import os; print("{JOB_SECRET}" in os.environ)'
child = subprocess.run([sys.executable, '-c', check], capture_output=True, text=True).stdout.strip()
print('SEEN', seen, 'CHILD', child, flush=True)
"""
    result = run_job("run", "-np", "2", sys.executable, "-c", code, timeout=60)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert result.lines("stdout", rank) == ["SEEN [] CHILD False"]


def test_forged_own_failure_and_deadlock_records_do_not_move_the_blame():
    result = run_job("run", "-np", "2", *python_script("forge_failure_records.py"), timeout=60)
    assert result.returncode == 1, result.stderr
    assert re.search(r"torchring run: rank 1 \(pid \d+ on localhost\) raised ValueError: the real failure, on rank 1",
                     result.stderr), result.stderr
    assert "ignoring the value of 'torchring/own_failure/0'" in result.stderr
    assert "ignoring the value of 'torchring/deadlock'" in result.stderr
    assert "forged" not in result.stderr.replace("forge_failure_records", "")
