"""The spawner that fixed and elastic jobs share, with real child processes: the environment a process
gets, its output prefix and files, the Horovod shim, and ranks in containers (a stand-in ``docker``)."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from torchring.launch.spawn.containers import ContainerOptions
from torchring.launch.spawn.rank_env import EnvironmentPlan
from torchring.launch.spawn.spawner import ProcessName, Spawner, SpawnSettings
from torchring.launch.spawn.ssh import SshOptions
from torchring.store_auth import JobCredentials

SCRIPTS = Path(__file__).resolve().parents[1] / "integration" / "scripts"
SHOW_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in ['MASTER_ADDR', 'MASTER_PORT', "
            "'TORCHRING_STORE_PORT', 'TORCHRING_WORKER_ID', 'TUNED', 'FROM_ENV', 'OMP_NUM_THREADS', 'PATH', "
            "'PYTHONPATH', 'PYTHONUNBUFFERED']}))")


def finish(spawned):
    code = spawned.process.wait(timeout=60)
    for relay in spawned.relays:
        relay.join(timeout=10)
    if spawned.process.stdin is not None:
        spawned.process.stdin.close()
    return code


def spawner(tmp_path, command, **settings):
    plan = EnvironmentPlan({**os.environ, "TUNED": "1"}, extra={"FROM_ENV": "a b $c"})
    return Spawner(SpawnSettings(command, plan, ssh=SshOptions(python=sys.executable),
                                 output_dir=str(tmp_path / "out"), **settings), store_port=12345,
                   credentials=JobCredentials("job", b"s" * 32))


def test_a_local_worker_gets_its_variables_the_store_and_its_own_output_files(tmp_path, capfd):
    started = spawner(tmp_path, [sys.executable, "-c", SHOW_ENV]).start(
        ProcessName("worker", 3), "localhost", {"TORCHRING_WORKER_ID": "w3"}, local_size=2)
    assert finish(started) == 0 and not started.remote
    env = json.loads((tmp_path / "out" / "worker.3" / "stdout").read_text())
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == env["TORCHRING_STORE_PORT"] == "12345"
    assert env["TORCHRING_WORKER_ID"] == "w3" and env["TUNED"] == "1" and env["FROM_ENV"] == "a b $c"
    assert env["PATH"] == os.environ["PATH"] and env["PYTHONUNBUFFERED"] == "1"
    expected_threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // 2))
    assert env["OMP_NUM_THREADS"] == expected_threads
    console = capfd.readouterr().out.splitlines()
    assert console == [f"[w3]<stdout>:{json.dumps(env)}"]


def test_a_hidden_rank_still_writes_its_files_and_the_shim_serves_horovod(tmp_path, capfd):
    code = "import horovod.torch as hvd, torchring; print(hvd.allreduce is torchring.allreduce)"
    started = spawner(tmp_path, [sys.executable, "-c", code], horovod_compat=True).start(
        ProcessName("rank", 1), "localhost", {}, local_size=1, show=False)
    assert finish(started) == 0
    assert (tmp_path / "out" / "rank.1" / "stdout").read_text() == "True\n"
    assert capfd.readouterr().out == ""


def test_a_remote_host_without_preflight_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="host h9 has not passed preflight"):
        spawner(tmp_path, ["true"]).start(ProcessName("worker", 0), "h9", {}, local_size=1)


def test_a_worker_in_a_container_runs_under_docker_and_is_stopped(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!{sys.executable}\n" + (SCRIPTS / "fake_docker.py").read_text())
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    started = spawner(tmp_path, [sys.executable, "-c", SHOW_ENV], container=ContainerOptions(image="img", gpus=False),
                      container_workdir=str(tmp_path)).start(ProcessName("worker", 2), "localhost", {}, local_size=1)
    assert finish(started) == 0 and started.remote
    env = json.loads((tmp_path / "out" / "worker.2" / "stdout").read_text())
    assert env["PATH"] == os.defpath and env["FROM_ENV"] == "a b $c" and env["MASTER_PORT"] == "12345"
    calls = [json.loads(line) for line in (tmp_path / "docker.log").read_text().splitlines()]
    run = next(call for call in calls if call[0] == "run")
    assert run[run.index("--name") + 1] == "torchring-job-worker2"
    assert ["stop", "-t", "5", "torchring-job-worker2"] in calls


def test_a_rank_gets_the_variables_torchs_env_rendezvous_reads_from_an_agent_store():
    from torchring.launch.hosts import SlotAssignment
    from torchring.launch.spawn.rank_env import topology_variables

    variables = topology_variables(SlotAssignment(1, 2, 1, 2, 0, 1, "localhost", 0, 1))
    assert variables["RANK"] == "1" and variables["WORLD_SIZE"] == "2" and variables["LOCAL_RANK"] == "1"
    # torch 2.4's env:// needs the restart count whenever the agent (here: the launcher) serves the store
    assert variables["TORCHELASTIC_USE_AGENT_STORE"] == "True" and variables["TORCHELASTIC_RESTART_COUNT"] == "0"
