"""The pods ``torchring k8s`` describes find their ranks: each "node" is run here as a local torchrun with
exactly the arguments and environment its manifest gives it.

* Indexed Job: the container's command and args, with ``$(JOB_COMPLETION_INDEX)`` expanded the way the
  kubelet does (from the container's env, where the downward API supplies the index) and only the
  rendezvous address changed to 127.0.0.1 and a free port.
* PyTorchJob: ``torchrun <program>`` with the container's env plus what Kubeflow's training operator adds
  to each pod (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
  ``PET_MASTER_PORT``, and ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``RANK`` per node, which
  torchrun replaces for its ranks), or with ``elasticPolicy`` the c10d rendezvous variables.

Inside, ``hvd.init()`` must pick torchrun's environment, rank 0..1 of 2, and an allreduce must work.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from torchring.deploy import k8s
from torchring.deploy.k8s_cli import build_parser, spec_from_args

from ..ports import free_port
from .jobs import MARKER_VARIABLE, processes_with_marker, wait_until_gone

TIMEOUT_S = 120
PROBE_PREFIX = "K8S_PROBE "
PROBE = textwrap.dedent(f"""\
    import json
    import os
    import sys

    import torch

    import torchring as hvd
    from torchring.environments import detect_environment

    environment = detect_environment().name
    hvd.init()
    total = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="k8s.ones")
    report = {{
        "environment": environment, "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
        "allreduce": total.tolist(), "group_rank": os.environ.get("GROUP_RANK"),
        "manifest_value": os.environ.get("TORCHRING_K8S_TEST_VALUE"),
        "checkpoint_dir": os.environ.get("TORCHRING_CHECKPOINT_DIR"),
    }}
    print({PROBE_PREFIX!r} + json.dumps(report), flush=True)
    hvd.shutdown()
    sys.stdout.flush()
    os._exit(0)  # gloo can abort at interpreter exit on some torch versions
""")
#: Variables of the surrounding shell that would change what the ranks discover.
FOREIGN = re.compile(r"(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|MASTER_ADDR|"
                     r"MASTER_PORT|JOB_COMPLETION_INDEX|(PET|TORCHELASTIC|TORCHRING|HOROVOD|SLURM|OMPI|PMI|PMIX)_.*)")


def manifests(tmp_path: Path, *extra: str) -> list[dict]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = ["--name", "probe", "--image", "registry.example.com/train:1", "--nodes", "2", "--cpus-per-node", "1",
            "--command", f"python {script}", "--checkpoint-pvc", "probe-checkpoints",
            "--env", "TORCHRING_K8S_TEST_VALUE=from-the-manifest", *extra]
    return build(argv)


#: The ``Secret`` objects made with the manifests, by name: what ``secretKeyRef`` resolves to.
SECRETS: dict[str, dict[str, str]] = {}


def build(argv: list[str]) -> list[dict]:
    """The manifests after their ``Secret``, which is kept in ``SECRETS`` for ``container_env``."""
    secret, *objects = k8s.build_manifests(spec_from_args(build_parser().parse_args(argv)))
    assert secret["kind"] == "Secret"
    SECRETS[secret["metadata"]["name"]] = secret["stringData"]
    return objects


def the_container(template: dict) -> dict:
    (container,) = template["spec"]["containers"]
    return container


def container_env(container: dict, completion_index: int | None = None) -> dict[str, str]:
    """The container's variables as the kubelet resolves them (the downward API gives the index)."""
    env = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry["valueFrom"]:
            reference = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = SECRETS[reference["name"]][reference["key"]]
        else:
            assert entry["valueFrom"] == {"fieldRef": {"fieldPath": k8s.COMPLETION_INDEX_FIELD}}, entry
            assert completion_index is not None
            env[entry["name"]] = str(completion_index)
    return env


def expand(argument: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command/args: defined variables are replaced, ``$$`` is ``$``."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda match: "$" if match.group(0) == "$$" else env.get(match.group(1), match.group(0)),
                  argument)


def torchrun_command(container: dict, args: list[str]) -> list[str]:
    assert container["command"] == ["torchrun"]
    return [sys.executable, "-m", "torch.distributed.run", *args]


def local_environment(pod_env: dict[str, str], marker: str, tmp_path: Path) -> dict[str, str]:
    """This process's environment as a pod would see it; temporary files (torchrun's log folders) go to
    ``tmp_path``, not the machine's /tmp."""
    base = {name: value for name, value in os.environ.items() if not FOREIGN.fullmatch(name)}
    return {**base, **pod_env, MARKER_VARIABLE: marker, "TMPDIR": str(tmp_path)}


def run_nodes(commands: list[tuple[list[str], dict[str, str]]], cwd: Path, marker: str) -> list[list[dict]]:
    """Start every node at once, wait up to TIMEOUT_S for each, return each node's probe reports."""
    processes = []
    try:
        for command, env in commands:
            processes.append(subprocess.Popen(command, env=env, cwd=cwd, text=True, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, start_new_session=True))
        outputs = []
        for node, process in enumerate(processes):
            try:
                stdout, stderr = process.communicate(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"node {node} did not finish within {TIMEOUT_S} s")
            assert process.returncode == 0, f"node {node} exited with {process.returncode}:\n{stdout}\n{stderr}"
            outputs.append(stdout)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        for pid in processes_with_marker(marker):  # torchrun's ranks run in sessions of their own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert wait_until_gone(marker) == []
    return [[json.loads(line[len(PROBE_PREFIX):]) for line in stdout.splitlines() if line.startswith(PROBE_PREFIX)]
            for stdout in outputs]


def check_reports(per_node: list[list[dict]], node_rank_is_given: bool = True) -> None:
    """One rank per node (--cpus-per-node, 1 proc), ranks 0..1 of 2. A static rendezvous numbers nodes by
    their --node-rank; c10d (elastic) numbers them as they join, so there only the set of ranks is fixed."""
    assert [len(reports) for reports in per_node] == [1, 1]
    assert sorted(reports[0]["rank"] for reports in per_node) == [0, 1]
    for node, (report,) in enumerate(per_node):
        node_rank = node if node_rank_is_given else report["rank"]
        assert report["environment"] == "torchrun"
        assert (report["rank"], report["size"]) == (node_rank, 2)
        assert (report["local_rank"], report["local_size"]) == (0, 1)
        assert (report["cross_rank"], report["cross_size"]) == (node_rank, 2)
        assert report["group_rank"] == str(node_rank)
        assert report["allreduce"] == [2.0, 2.0, 2.0]
        assert report["manifest_value"] == "from-the-manifest"
        assert report["checkpoint_dir"] == "/checkpoints"


def test_indexed_job_pods_discover_their_ranks(tmp_path):
    service, job = manifests(tmp_path)
    container = the_container(job["spec"]["template"])
    assert job["spec"]["completions"] == 2
    port = free_port()
    marker = uuid.uuid4().hex
    commands = []
    for index in range(job["spec"]["completions"]):
        pod_env = container_env(container, completion_index=index)
        args = [expand(argument, pod_env) for argument in container["args"]]
        assert f"--node-rank={index}" in args
        master = [i for i, argument in enumerate(args) if argument.startswith("--master-addr=")]
        master_port = [i for i, argument in enumerate(args) if argument.startswith("--master-port=")]
        assert len(master) == len(master_port) == 1
        assert args[master[0]] == f"--master-addr=probe-0.{service['metadata']['name']}"
        args[master[0]] = "--master-addr=127.0.0.1"
        args[master_port[0]] = f"--master-port={port}"
        commands.append((torchrun_command(container, args), local_environment(pod_env, marker, tmp_path)))
    check_reports(run_nodes(commands, tmp_path, marker))


def operator_environment(job: dict, node_rank: int, port: int) -> dict[str, str]:
    """What Kubeflow's training operator adds to pod ``node_rank`` (master-0 is node 0, worker-i node i+1),
    with the Master's address replaced by 127.0.0.1 and its port by a free one."""
    spec = job["spec"]
    nodes = sum(replica["replicas"] for replica in spec["pytorchReplicaSpecs"].values())
    nproc = spec["nprocPerNode"]
    env = {"PYTHONUNBUFFERED": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "WORLD_SIZE": str(nodes * int(nproc)),
           "RANK": str(node_rank), "PET_NPROC_PER_NODE": nproc, "PET_NODE_RANK": str(node_rank)}
    elastic = spec.get("elasticPolicy")
    if elastic is None:
        env["PET_NNODES"] = str(nodes)
    else:
        env.update({"PET_RDZV_ENDPOINT": f"127.0.0.1:{port}", "PET_RDZV_BACKEND": elastic["rdzvBackend"],
                    "PET_NNODES": f"{elastic['minReplicas']}:{elastic['maxReplicas']}",
                    "PET_MAX_RESTARTS": str(elastic["maxRestarts"]), "PET_RDZV_ID": elastic["rdzvId"]})
    return env


@pytest.mark.parametrize("elastic", [False, True], ids=["static", "elastic"])
def test_pytorchjob_pods_discover_their_ranks(tmp_path, elastic):
    extra = ["--kind", "pytorchjob"] + (["--min-nodes", "2", "--max-nodes", "2"] if elastic else [])
    (job,) = manifests(tmp_path, *extra)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)
    assert job["spec"]["nprocPerNode"] == "1"
    port = free_port()
    marker = uuid.uuid4().hex
    commands = []
    for node_rank, role in enumerate(["Master", "Worker"]):
        container = the_container(replicas[role]["template"])
        assert container["name"] == "pytorch"
        assert not any(argument.startswith("--") for argument in container["args"])  # all from PET_*
        pod_env = {**container_env(container), **operator_environment(job, node_rank, port)}
        commands.append((torchrun_command(container, container["args"]), local_environment(pod_env, marker, tmp_path)))
    check_reports(run_nodes(commands, tmp_path, marker), node_rank_is_given=not elastic)


def test_two_pods_of_the_job_layout_train_the_example(tmp_path):
    """What ``Done when`` asks: 2 processes with exactly the Job layout's environment train examples/mnist.py."""
    root = Path(__file__).resolve().parents[2]
    argv = ["--name", "mnist", "--image", "registry.example.com/train:1", "--nodes", "2", "--cpus-per-node", "1",
            "--command", f"python {root / 'examples' / 'mnist.py'} --epochs 1 --log-interval 100"]
    service, job = build(argv)
    container = the_container(job["spec"]["template"])
    port = free_port()
    marker = uuid.uuid4().hex
    processes = []
    try:
        for index in range(2):
            pod_env = container_env(container, completion_index=index)
            args = [expand(argument, pod_env) for argument in container["args"]]
            args = ["--master-addr=127.0.0.1" if a.startswith("--master-addr=") else
                    f"--master-port={port}" if a.startswith("--master-port=") else a for a in args]
            processes.append(subprocess.Popen(torchrun_command(container, args), cwd=root, text=True,
                                              env=local_environment(pod_env, marker, tmp_path), stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, start_new_session=True))
        outputs = [process.communicate(timeout=TIMEOUT_S) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        for pid in processes_with_marker(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert all(process.returncode == 0 for process in processes), outputs
    accuracy = re.search(r"Accuracy: ([\d.]+)", outputs[0][0])
    assert accuracy and 0.0 < float(accuracy.group(1)) <= 1.0, outputs[0]
    assert "Train Epoch: 1" in outputs[0][0] and "Test set" not in outputs[1][0]
