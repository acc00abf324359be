"""``torchring k8s``: the manifests it writes, checked against Kubernetes' own schemas.

* Services and Jobs are validated with kubernetes-validate in strict mode (unknown fields fail), both
  through its Python API and its command line, for several option combinations; a deliberately broken
  Job must fail, so the check is known to bite.
* kubernetes-validate has no schema for Kubeflow's PyTorchJob: given one, its API raises
  ``SchemaNotFoundError`` and its command line only prints a warning (exit status 0, and nothing at all
  with ``--no-warn``). PyTorchJobs are therefore validated against torchring's own JSON Schema
  (``torchring/deploy/schemas/pytorchjob.schema.json``), and each replica's pod template, wrapped in a
  core ``v1 PodTemplate``, against Kubernetes' schema in strict mode.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from torchring.deploy import k8s
from torchring.deploy.k8s import render_yaml
from torchring.deploy.k8s_cli import build_parser, main, spec_from_args

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_SOURCE = ROOT / "src" / "torchring" / "deploy" / "schemas" / "pytorchjob.schema.json"
KUBERNETES_VERSION = "1.30"
IMAGE = "registry.example.com/ml/train:1.0"

#: Option combinations: CPU and GPU, 1 and 3 nodes, checkpoint volume, node selectors, pull secrets, env.
CASES = {
    "cpu-1-node": ["--name", "mnist", "--image", IMAGE, "--cpus-per-node", "2"],
    "cpu-3-nodes-everything": [
        "--name", "mnist-cpu", "--image", IMAGE, "--nodes", "3", "--cpus-per-node", "7500m", "--procs-per-node", "2",
        "--memory", "16Gi", "--checkpoint-pvc", "train-checkpoints", "--env", "TORCHRING_LOG_LEVEL=DEBUG",
        "--env", "TORCHRING_FUSION_THRESHOLD=67108864", "--node-selector", "pool=cpu",
        "--node-selector", "topology.kubernetes.io/zone=eu-west-1a", "--image-pull-secret", "regcred",
        "--image-pull-secret", "mirror-cred", "--namespace", "ml-team", "--shm-size", "2Gi",
        "--command", "python examples/mnist.py --epochs 3 --batch-size 64"],
    "gpu-1-node": ["--name", "gpu-one", "--image", IMAGE, "--gpus-per-node", "8", "--memory", "200Gi"],
    "gpu-3-nodes": [
        "--name", "gpu-three", "--image", IMAGE, "--nodes", "3", "--gpus-per-node", "4", "--memory", "64Gi",
        "--checkpoint-pvc", "ckpt", "--node-selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
        "--image-pull-secret", "regcred", "--port", "23456", "--env", "NCCL_DEBUG=WARN",
        "--command", "python -m mypkg.train --lr 0.1"],
    "cpu-3-nodes-shell-command": [
        "--name", "shell", "--image", IMAGE, "--nodes", "3", "--cpus-per-node", "1", "--backoff-limit", "2",
        "--command", "bash -c 'python train.py && echo done'"],
}
ELASTIC_CASES = {
    "elastic-3-of-2-to-4": ["--nodes", "3", "--min-nodes", "2", "--max-nodes", "4"],
    "elastic-1-up-to-3": ["--max-nodes", "3", "--max-restarts", "5"],
}


def build(argv: list[str]) -> list[dict]:
    """The manifests after the job's ``Secret`` (which ``test_the_job_secret_*`` check)."""
    objects = k8s.build_manifests(spec_from_args(build_parser().parse_args(argv)))
    assert objects[0]["kind"] == "Secret"
    return objects[1:]


def job_objects(case: str) -> list[dict]:
    return build(CASES[case])


def pytorchjob_objects(case: str) -> list[dict]:
    return build(["--kind", "pytorchjob", *CASES[case]])


def all_pytorchjobs() -> list[dict]:
    jobs = [obj for case in CASES for obj in pytorchjob_objects(case)]
    base = ["--kind", "pytorchjob", "--name", "elastic", "--image", IMAGE, "--gpus-per-node", "2",
            "--checkpoint-pvc", "ckpt"]
    jobs += [obj for extra in ELASTIC_CASES.values() for obj in build(base + extra)]
    return jobs


def load_pytorchjob_schema() -> dict:
    """The schema as package data (importlib.resources), else from the source tree (editable installs)."""
    try:
        resource = importlib.resources.files("torchring.deploy").joinpath("schemas/pytorchjob.schema.json")
        return json.loads(resource.read_text(encoding="utf-8"))
    except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError, OSError):
        return json.loads(SCHEMA_SOURCE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def pytorchjob_validator():
    schema = load_pytorchjob_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def kubernetes_validate_cli() -> Path:
    path = Path(sys.executable).parent / "kubernetes-validate"
    if not path.exists():
        pytest.skip("the kubernetes-validate command is not installed next to this Python")
    return path


def run_kubernetes_validate(*arguments: str | Path) -> subprocess.CompletedProcess:
    command = [str(kubernetes_validate_cli()), "--strict", "-k", KUBERNETES_VERSION, *map(str, arguments)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def validate_strict(obj: dict) -> str:
    return kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def container_of(pod_template: dict) -> dict:
    containers = pod_template["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(container: dict) -> dict:
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in container["env"]}


def pod_templates(obj: dict) -> dict[str, dict]:
    if obj["kind"] == "Job":
        return {"job": obj["spec"]["template"]}
    if obj["kind"] == "PyTorchJob":
        return {role: spec["template"] for role, spec in obj["spec"]["pytorchReplicaSpecs"].items()}
    return {}


# -- kubernetes-validate: Service and Job ----------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_service_and_job_validate_strictly(case):
    objects = job_objects(case)
    assert [obj["kind"] for obj in objects] == ["Service", "Job"]
    for obj in objects:
        assert validate_strict(obj) == KUBERNETES_VERSION


def test_written_files_pass_the_kubernetes_validate_command(tmp_path):
    files = []
    for case, argv in CASES.items():
        directory = tmp_path / case
        assert main([*argv, "--output-dir", str(directory)]) == 0
        files += sorted(directory.iterdir())
    assert len(files) == 3 * len(CASES)  # the Secret, the Service and the Job
    result = run_kubernetes_validate(*files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" passed for resource ") == len(files), result.stdout
    assert "WARN" not in result.stdout and "ERROR" not in result.stdout


def _unknown_container_field(job):
    container_of(job["spec"]["template"])["imagePullPolcy"] = "Always"


def _string_completions(job):
    job["spec"]["completions"] = "3"


def _unknown_job_spec_field(job):
    job["spec"]["completionsMode"] = "Indexed"


def _env_value_not_a_string(job):
    container_of(job["spec"]["template"])["env"].append({"name": "EPOCHS", "value": 3})


BROKEN_JOBS = {"unknown container field": _unknown_container_field, "completions as a string": _string_completions,
               "unknown spec field": _unknown_job_spec_field, "env value not a string": _env_value_not_a_string}


@pytest.mark.parametrize("breakage", sorted(BROKEN_JOBS))
def test_a_broken_job_fails_validation(breakage, tmp_path):
    job = copy.deepcopy(job_objects("cpu-3-nodes-everything")[1])
    validate_strict(job)
    BROKEN_JOBS[breakage](job)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strict(job)
    path = tmp_path / "broken-job.yaml"
    path.write_text(k8s.render_yaml([job]))
    result = run_kubernetes_validate(path)
    assert result.returncode == 1, result.stdout
    assert "ERROR" in result.stdout and "did not validate for resource job/mnist-cpu" in result.stdout


# -- PyTorchJob: our schema, plus Kubernetes' schema for its pod templates -------------------------


def test_the_schema_ships_next_to_the_code_and_is_draft_2020_12():
    schema = load_pytorchjob_schema()
    assert schema == json.loads(SCHEMA_SOURCE.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_every_generated_pytorchjob_matches_the_schema(pytorchjob_validator):
    jobs = all_pytorchjobs()
    assert len(jobs) == len(CASES) + len(ELASTIC_CASES)
    for job in jobs:
        errors = [error.message for error in pytorchjob_validator.iter_errors(job)]
        assert errors == [], (job["metadata"]["name"], errors)


def test_pytorchjob_pod_templates_validate_strictly_as_kubernetes_pod_templates():
    for job in all_pytorchjobs():
        for role, template in pod_templates(job).items():
            wrapped = {"apiVersion": "v1", "kind": "PodTemplate",
                       "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}"}, "template": template}
            assert validate_strict(wrapped) == KUBERNETES_VERSION


def _container_named_trainer(job):
    container_of(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])["name"] = "trainer"


def _unknown_pytorchjob_spec_field(job):
    job["spec"]["nprocsPerNode"] = "2"


def _nproc_per_node_as_an_integer(job):
    job["spec"]["nprocPerNode"] = 2


def _two_masters(job):
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2


def _static_rendezvous(job):
    job["spec"]["elasticPolicy"] = {"minReplicas": 1, "maxReplicas": 2, "rdzvBackend": "static"}


def _unknown_container_field_in_worker(job):
    container_of(job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"])["imagePullPolcy"] = "Always"


def _second_container(job):
    template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    template["spec"]["containers"].append(copy.deepcopy(container_of(template)))


def _wrong_api_version(job):
    job["apiVersion"] = "kubeflow.org/v2"


BROKEN_PYTORCHJOBS = {
    "container named trainer": _container_named_trainer, "unknown spec field": _unknown_pytorchjob_spec_field,
    "nprocPerNode as an integer": _nproc_per_node_as_an_integer, "two masters": _two_masters,
    "static rendezvous backend": _static_rendezvous, "unknown container field": _unknown_container_field_in_worker,
    "second container": _second_container, "wrong apiVersion": _wrong_api_version,
}


@pytest.mark.parametrize("breakage", sorted(BROKEN_PYTORCHJOBS))
def test_a_broken_pytorchjob_fails_the_schema(breakage, pytorchjob_validator):
    job = copy.deepcopy(pytorchjob_objects("gpu-3-nodes")[0])
    pytorchjob_validator.validate(job)
    BROKEN_PYTORCHJOBS[breakage](job)
    with pytest.raises(jsonschema.ValidationError):
        pytorchjob_validator.validate(job)


def test_kubernetes_validate_cannot_check_a_pytorchjob(tmp_path):
    """Why PyTorchJobs get our schema: kubernetes-validate knows no custom resources. Its API refuses
    the object; its command line only warns and exits 0 (and with --no-warn says nothing), so relying on
    it would let any PyTorchJob through."""
    job = pytorchjob_objects("gpu-3-nodes")[0]
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError) as refused:
        validate_strict(job)
    assert "PyTorchJob" in refused.value.message
    path = tmp_path / "pytorchjob.yaml"
    path.write_text(k8s.render_yaml([job]))
    result = run_kubernetes_validate(path)
    assert "WARN" in result.stdout and "Couldn't find schema for kind PyTorchJob" in result.stdout, result.stdout
    assert "passed" not in result.stdout
    assert result.returncode == 0  # a warning only: the exit status alone would not catch a broken PyTorchJob
    silent = run_kubernetes_validate("--no-warn", path)
    assert (silent.returncode, silent.stdout.strip()) == (0, "")


# -- what the manifests say ------------------------------------------------------------------------


def test_indexed_job_runs_torchrun_with_the_completion_index_as_node_rank():
    service, job = job_objects("cpu-3-nodes-everything")
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed", 3, 3, 0)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == service["metadata"]["name"] == "mnist-cpu"
    container = container_of(spec["template"])
    assert container["command"] == ["torchrun"]
    assert container["args"] == [
        "--nnodes=3", "--nproc-per-node=2", "--node-rank=$(JOB_COMPLETION_INDEX)",
        "--master-addr=mnist-cpu-0.mnist-cpu", "--master-port=29500",
        "examples/mnist.py", "--epochs", "3", "--batch-size", "64"]
    index = container["env"][0]
    assert index == {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}


def test_headless_service_selects_the_job_pods_and_publishes_them_before_ready():
    service, job = job_objects("gpu-3-nodes")
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["ports"] == [{"name": "rendezvous", "port": 23456, "targetPort": 23456, "protocol": "TCP"}]
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"] and spec["selector"].items() <= pod_labels.items()
    assert "--master-port=23456" in container_of(job["spec"]["template"])["args"]


def test_gpu_pods_request_gpus_and_run_one_rank_per_gpu():
    _, job = job_objects("gpu-3-nodes")
    container = container_of(job["spec"]["template"])
    assert container["resources"] == {"requests": {"memory": "64Gi"},
                                      "limits": {"nvidia.com/gpu": "4", "memory": "64Gi"}}
    assert "--nproc-per-node=4" in container["args"]
    assert container["args"][-4:] == ["-m", "mypkg.train", "--lr", "0.1"]
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    pytorchjob = pytorchjob_objects("gpu-3-nodes")[0]
    assert pytorchjob["spec"]["nprocPerNode"] == "4"


def test_cpu_pods_request_and_limit_cpus():
    _, job = job_objects("cpu-1-node")
    container = container_of(job["spec"]["template"])
    assert container["resources"] == {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
    assert "--nproc-per-node=1" in container["args"]


@pytest.mark.parametrize("kind", ["job", "pytorchjob"])
def test_every_pod_is_locked_down_with_only_scratch_and_checkpoint_volumes_writable(kind):
    objects = job_objects("cpu-3-nodes-everything") if kind == "job" else pytorchjob_objects("cpu-3-nodes-everything")
    templates = [template for obj in objects for template in pod_templates(obj).values()]
    assert len(templates) == (1 if kind == "job" else 2)
    for template in templates:
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["fsGroup"] == 1000
        container = container_of(template)
        assert container["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                                "capabilities": {"drop": ["ALL"]}}
        assert {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]} == {
            "/tmp": "tmp", "/dev/shm": "dshm", "/checkpoints": "checkpoints"}
        assert pod["volumes"] == [
            {"name": "tmp", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "train-checkpoints"}}]
        env = env_of(container)
        assert env["TORCHRING_CHECKPOINT_DIR"] == "/checkpoints"
        assert env["TORCHRING_LOG_LEVEL"] == "DEBUG" and env["TORCHRING_FUSION_THRESHOLD"] == "67108864"
        assert env["HOME"] == "/tmp"
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]
        assert pod["nodeSelector"] == {"pool": "cpu", "topology.kubernetes.io/zone": "eu-west-1a"}
        assert container["resources"] == {"requests": {"cpu": "7500m", "memory": "16Gi"},
                                          "limits": {"cpu": "7500m", "memory": "16Gi"}}
    assert all(obj["metadata"]["namespace"] == "ml-team" for obj in objects)


def test_without_a_checkpoint_claim_there_is_no_checkpoint_volume_or_variable():
    _, job = job_objects("cpu-1-node")
    container = container_of(job["spec"]["template"])
    assert "TORCHRING_CHECKPOINT_DIR" not in env_of(container)
    assert [volume["name"] for volume in job["spec"]["template"]["spec"]["volumes"]] == ["tmp", "dshm"]
    assert "nodeSelector" not in job["spec"]["template"]["spec"]
    assert "imagePullSecrets" not in job["spec"]["template"]["spec"]


def test_pytorchjob_has_a_master_and_workers_named_pytorch_running_plain_torchrun():
    job = pytorchjob_objects("cpu-3-nodes-everything")[0]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    spec = job["spec"]
    assert spec["nprocPerNode"] == "2" and "elasticPolicy" not in spec
    assert spec["runPolicy"] == {"backoffLimit": 0}
    replicas = spec["pytorchReplicaSpecs"]
    assert {role: replica["replicas"] for role, replica in replicas.items()} == {"Master": 1, "Worker": 2}
    for replica in replicas.values():
        assert replica["restartPolicy"] == "Never"
        container = container_of(replica["template"])
        assert container["name"] == "pytorch"
        assert container["command"] == ["torchrun"]
        assert container["args"] == ["examples/mnist.py", "--epochs", "3", "--batch-size", "64"]
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"}]
        assert not any(name.startswith("PET_") or name in ("RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX")
                       for name in env_of(container))


def test_a_one_node_pytorchjob_has_no_worker_replicas():
    job = pytorchjob_objects("gpu-1-node")[0]
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_elastic_pytorchjob_uses_c10d_rendezvous_on_the_master():
    argv = ["--kind", "pytorchjob", "--name", "elastic", "--image", IMAGE, "--gpus-per-node", "2",
            "--nodes", "3", "--min-nodes", "2", "--max-nodes", "4", "--port", "29400"]
    job = build(argv)[0]
    assert job["spec"]["elasticPolicy"] == {
        "minReplicas": 2, "maxReplicas": 4, "rdzvBackend": "c10d", "rdzvHost": "elastic-master-0",
        "rdzvPort": 29400, "rdzvId": "elastic", "maxRestarts": 3}
    assert job["spec"]["runPolicy"] == {"backoffLimit": 3}
    assert {replica["restartPolicy"] for replica in job["spec"]["pytorchReplicaSpecs"].values()} == {"OnFailure"}
    one = build(["--kind", "pytorchjob", "--name", "elastic", "--image", IMAGE, "--cpus-per-node", "1",
                 "--max-nodes", "3"])[0]
    assert (one["spec"]["elasticPolicy"]["minReplicas"], one["spec"]["elasticPolicy"]["maxReplicas"]) == (1, 3)


@pytest.mark.parametrize(("command", "program"), [
    (["python", "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    (["/usr/bin/python3.11", "train.py"], ["train.py"]),
    (["python3", "-m", "pkg.train", "-x"], ["-m", "pkg.train", "-x"]),
    (["python", "-u", "train.py"], ["--no-python", "python", "-u", "train.py"]),
    (["train.py", "--epochs", "2"], ["train.py", "--epochs", "2"]),
    (["bash", "-c", "python train.py"], ["--no-python", "bash", "-c", "python train.py"]),
])
def test_the_training_command_becomes_torchruns_program(command, program):
    assert k8s.torchrun_program(command) == program


# -- the command line ------------------------------------------------------------------------------


def test_stdout_is_yaml_that_reads_back_to_the_same_objects(capsys):
    argv = ["--kind", "job", *CASES["cpu-3-nodes-everything"]]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.count("\n---\n") == 2
    secret, *objects = yaml.safe_load_all(text)
    assert secret["kind"] == "Secret" and objects == build(argv)  # each run makes a new secret
    assert "clusterIP: None" in text
    assert main(["--kind", "pytorchjob", *CASES["gpu-1-node"]]) == 0
    loaded = list(yaml.safe_load_all(capsys.readouterr().out))[1:]
    assert loaded == pytorchjob_objects("gpu-1-node") and loaded[0]["spec"]["nprocPerNode"] == "8"


def test_output_dir_gets_one_file_per_object(tmp_path, capsys):
    directory = tmp_path / "manifests" / "nested"
    assert main([*CASES["cpu-1-node"], "--output-dir", str(directory)]) == 0
    secret = "secret-mnist-torchring-secret.yaml"
    assert sorted(path.name for path in directory.iterdir()) == ["job-mnist.yaml", secret, "service-mnist.yaml"]
    assert [yaml.safe_load((directory / "service-mnist.yaml").read_text())] == job_objects("cpu-1-node")[:1]
    assert capsys.readouterr().out.split() == [str(directory / name) for name in
                                               (secret, "service-mnist.yaml", "job-mnist.yaml")]


def test_python_dash_m_runs_the_cli():
    result = subprocess.run([sys.executable, "-m", "torchring.deploy.k8s_cli", *CASES["cpu-1-node"]],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert [obj["kind"] for obj in yaml.safe_load_all(result.stdout)] == ["Secret", "Service", "Job"]


BASE = ["--name", "mnist", "--image", IMAGE]


@pytest.mark.parametrize(("argv", "message"), [
    (["--name", "My_Job", "--image", IMAGE, "--cpus-per-node", "1"], "not a valid DNS-1123 label"),
    (["--name", "mnist-", "--image", IMAGE, "--cpus-per-node", "1"], "not a valid DNS-1123 label"),
    (["--name", "x" * 64, "--image", IMAGE, "--cpus-per-node", "1"], "not a valid DNS-1123 label"),
    (["--name", "2mnist", "--image", IMAGE, "--cpus-per-node", "1"], "must start with a letter"),
    (["--name", "x" * 62, "--image", IMAGE, "--cpus-per-node", "1", "--nodes", "11"], "too long for 11 node(s)"),
    (["--name", "x" * 54, "--image", IMAGE, "--cpus-per-node", "1", "--kind", "pytorchjob", "--nodes", "12"],
     "'" + "x" * 54 + "-worker-10'"),
    ([*BASE, "--gpus-per-node", "0"], "must be at least 1"),
    ([*BASE, "--gpus-per-node", "2", "--procs-per-node", "2"], "--procs-per-node goes with --cpus-per-node"),
    ([*BASE, "--cpus-per-node", "four"], "--cpus-per-node 'four' is not a Kubernetes quantity"),
    ([*BASE, "--cpus-per-node", "1", "--memory", "16GB"], "--memory '16GB' is not a Kubernetes quantity"),
    ([*BASE, "--cpus-per-node", "1", "--min-nodes", "1"], "need --kind pytorchjob"),
    ([*BASE, "--cpus-per-node", "1", "--kind", "pytorchjob", "--nodes", "2", "--min-nodes", "3"],
     "1 <= --min-nodes (3) <= --nodes (2)"),
    ([*BASE, "--cpus-per-node", "1", "--max-restarts", "2"], "--max-restarts applies to an elastic"),
    ([*BASE, "--cpus-per-node", "1", "--env", "RANK=3"], "--env RANK: set inside the pod"),
    ([*BASE, "--cpus-per-node", "1", "--env", "PET_NNODES=3"], "--env PET_NNODES: set inside the pod"),
    ([*BASE, "--cpus-per-node", "1", "--env", "NOVALUE"], "expected KEY=VALUE"),
    ([*BASE, "--cpus-per-node", "1", "--env", "A=1", "--env", "A=2"], "--env A is given twice"),
    ([*BASE, "--cpus-per-node", "1", "--node-selector", "pool=bad value"], "--node-selector value"),
    ([*BASE, "--cpus-per-node", "1", "--checkpoint-pvc", "My_Claim"], "--checkpoint-pvc 'My_Claim'"),
    ([*BASE, "--cpus-per-node", "1", "--namespace", "ML"], "--namespace 'ML' is not a valid DNS-1123 label"),
    ([*BASE, "--cpus-per-node", "1", "--command", "python 'unclosed"], "--command"),
    ([*BASE, "--cpus-per-node", "1", "--command", ""], "--command is empty"),
    ([*BASE, "--cpus-per-node", "1", "--port", "70000"], "--port 70000"),
])
def test_bad_options_are_refused_with_the_rule(argv, message, capsys):
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("torchring k8s: error: ") and message in error, error


@pytest.mark.parametrize(("argv", "message"), [
    (BASE, "one of the arguments --gpus-per-node --cpus-per-node is required"),
    ([*BASE, "--gpus-per-node", "1", "--cpus-per-node", "1"], "not allowed with argument"),
    (["--image", IMAGE, "--cpus-per-node", "1"], "the following arguments are required: --name"),
    ([*BASE, "--cpus-per-node", "1", "--kind", "deployment"], "invalid choice"),
    ([*BASE, "--cpus-per-node", "1", "--nodes", "two"], "'two' is not a whole number"),
])
def test_argparse_refuses_missing_or_conflicting_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_job_secret_is_a_fresh_secret_that_every_pod_reads_from_it(tmp_path):
    argv = ["--kind", "pytorchjob", *CASES["gpu-3-nodes"]]
    first = k8s.build_manifests(spec_from_args(build_parser().parse_args(argv)))
    second = k8s.build_manifests(spec_from_args(build_parser().parse_args(argv)))
    secret, job = first[0], first[1]
    assert secret["kind"] == "Secret" and secret["type"] == "Opaque"
    assert validate_strict(secret) == KUBERNETES_VERSION
    value = secret["stringData"]["job-secret"]
    assert len(bytes.fromhex(value)) == 32 and value != second[0]["stringData"]["job-secret"]
    for template in pod_templates(job).values():
        env = {entry["name"]: entry for entry in container_of(template)["env"]}
        assert env["TORCHRING_JOB_SECRET"] == {"name": "TORCHRING_JOB_SECRET", "valueFrom": {"secretKeyRef": {
            "name": secret["metadata"]["name"], "key": "job-secret"}}}
        assert env["TORCHRING_JOB_ID"]["value"] == job["metadata"]["name"]
    assert value not in render_yaml(first[1:])  # only in the Secret
    assert main([*argv, "--output-dir", str(tmp_path)]) == 0
    written = next(tmp_path.glob("secret-*.yaml"))
    assert written.stat().st_mode & 0o777 == 0o600


def test_the_job_secret_cannot_be_set_with_env():
    with pytest.raises(k8s.ManifestError, match="TORCHRING_JOB_SECRET"):
        build([*CASES["gpu-3-nodes"], "--env", "TORCHRING_JOB_SECRET=00"])
