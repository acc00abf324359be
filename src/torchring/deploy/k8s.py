"""Kubernetes manifests for a torchring job, built as plain dicts (no Kubernetes client needed).

Two layouts, both starting one ``torchrun`` per pod, which then starts the ranks of that node; inside,
``hvd.init()`` finds its rank from torchrun's variables (``TorchrunEnvironment``):

* ``job``: a headless ``Service`` and an Indexed ``batch/v1 Job``. Pod ``i`` gets the stable DNS name
  ``<name>-<i>.<name>`` and runs ``torchrun --node-rank=$(JOB_COMPLETION_INDEX)`` against pod 0.
* ``pytorchjob``: a Kubeflow ``kubeflow.org/v1 PyTorchJob``; the training operator sets the ``PET_*``
  variables that torchrun reads (``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``...), and with
  ``elasticPolicy`` the c10d rendezvous variables.

Every pod runs as a non-root user with a read-only root filesystem; ``/tmp``, ``/dev/shm`` and the
optional checkpoint volume are the only writable paths. A ``Secret`` made with the manifests holds the
job's secret, which every pod reads as ``TORCHRING_JOB_SECRET`` (``k8s_secret``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..contract import ELASTIC, JOB_ID, JOB_SECRET, RANK, SIZE, STORE_ADDR, STORE_PORT, WORKER_ID, horovod_name
from .k8s_secret import job_secret, new_secret_value, secret_env

KINDS = ("job", "pytorchjob")
DEFAULT_COMMAND = ("python", "examples/mnist.py")
DEFAULT_PORT = 29500
DEFAULT_SHM_SIZE = "8Gi"
#: Pod failures tolerated before the job counts as failed: a fixed-size job fails fast (resubmit it to
#: resume from the checkpoint volume); an elastic PyTorchJob restarts containers in place.
DEFAULT_BACKOFF_LIMIT = 0
DEFAULT_ELASTIC_BACKOFF_LIMIT = 3
DEFAULT_MAX_RESTARTS = 3
CHECKPOINT_MOUNT = "/checkpoints"
RUN_AS_USER = 1000
#: Kubeflow's training operator only treats the container with this name as the training container.
PYTORCHJOB_CONTAINER = "pytorch"
#: The container port name the training operator reads MASTER_PORT from.
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
JOB_CONTAINER = "trainer"
COMPLETION_INDEX_VARIABLE = "JOB_COMPLETION_INDEX"
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"(\d+(\.\d*)?|\.\d+)([numkMGTPE]|[KMGTPE]i)?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_MAX_LABEL = 63

#: Variables that Kubernetes, the training operator or torchrun set in the pod; overriding them with
#: ``--env`` would break rank discovery (or, for TORCHRING_RANK and friends, make ``hvd.init()`` pick
#: the wrong launcher).
RESERVED_ENV = frozenset({
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", COMPLETION_INDEX_VARIABLE, RANK, SIZE, ELASTIC, WORKER_ID,
    STORE_ADDR, STORE_PORT, horovod_name(RANK), horovod_name(SIZE), JOB_ID, JOB_SECRET,
})
RESERVED_ENV_PREFIXES = ("PET_", "TORCHELASTIC_")


class ManifestError(ValueError):
    """An option value that would produce a manifest Kubernetes (or the job) cannot use."""


@dataclass(frozen=True)
class K8sJobSpec:
    """Everything ``torchring k8s`` needs to write the manifests of one training job."""

    name: str
    image: str
    kind: str = "job"
    nodes: int = 1
    gpus_per_node: int | None = None
    cpus_per_node: str | None = None
    procs_per_node: int | None = None
    memory: str | None = None
    command: tuple[str, ...] = DEFAULT_COMMAND
    env: tuple[tuple[str, str], ...] = ()
    shm_size: str = DEFAULT_SHM_SIZE
    checkpoint_pvc: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    namespace: str | None = None
    port: int = DEFAULT_PORT
    min_nodes: int | None = None
    max_nodes: int | None = None
    max_restarts: int | None = None
    backoff_limit: int | None = None

    @property
    def ranks_per_node(self) -> int:
        """One rank per GPU, else ``procs_per_node`` (default 1) ranks on CPUs."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        return self.procs_per_node if self.procs_per_node is not None else 1

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None or self.max_nodes is not None

    @property
    def node_range(self) -> tuple[int, int]:
        """(min, max) nodes of an elastic job; an omitted bound is ``nodes``."""
        low = self.min_nodes if self.min_nodes is not None else self.nodes
        high = self.max_nodes if self.max_nodes is not None else self.nodes
        return low, high

    @property
    def effective_backoff_limit(self) -> int:
        if self.backoff_limit is not None:
            return self.backoff_limit
        return DEFAULT_ELASTIC_BACKOFF_LIMIT if self.elastic else DEFAULT_BACKOFF_LIMIT

    @property
    def service_name(self) -> str:
        """The headless Service of the ``job`` layout (also the pods' ``subdomain``)."""
        return self.name

    @property
    def master_address(self) -> str:
        """DNS name of node 0 in the ``job`` layout: ``<job>-0.<service>``."""
        return f"{self.name}-0.{self.service_name}"


# -- validation ------------------------------------------------------------------------------------


def check_dns1123_label(value: str, option: str) -> None:
    if not (len(value) <= _MAX_LABEL and _DNS1123_LABEL.fullmatch(value)):
        raise ManifestError(
            f"{option} {value!r} is not a valid DNS-1123 label: at most 63 characters, only lowercase letters "
            "(a-z), digits (0-9) and '-', starting and ending with a letter or digit (e.g. 'mnist-2')")


def check_dns1123_subdomain(value: str, option: str) -> None:
    if not (len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value)):
        raise ManifestError(
            f"{option} {value!r} is not a valid DNS-1123 subdomain: at most 253 characters, lowercase "
            "letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit")


def check_quantity(value: str, option: str) -> None:
    if not _QUANTITY.fullmatch(value):
        raise ManifestError(
            f"{option} {value!r} is not a Kubernetes quantity: a number with an optional suffix "
            "(m, k, M, G, T, Ki, Mi, Gi, Ti...), e.g. 4, 500m, 16Gi")


def derived_names(spec: K8sJobSpec) -> list[str]:
    """Host and Service names Kubernetes derives from ``--name``; each must fit in a DNS label."""
    if spec.kind == "job":
        return [f"{spec.name}-{spec.nodes - 1}"]
    names = [f"{spec.name}-master-0"]
    if spec.nodes > 1:
        names.append(f"{spec.name}-worker-{spec.nodes - 2}")
    return names


def validate_spec(spec: K8sJobSpec) -> None:
    """Raise ``ManifestError`` naming the option and the rule it breaks."""
    if spec.kind not in KINDS:
        raise ManifestError(f"--kind {spec.kind!r}: choose one of {', '.join(KINDS)}")
    check_dns1123_label(spec.name, "--name")
    if not spec.name[0].isalpha():
        raise ManifestError(
            f"--name {spec.name!r} must start with a letter: Kubernetes derives Service names from it, and "
            "Service names are RFC 1035 labels (a DNS-1123 label that starts with a letter)")
    for derived in derived_names(spec):
        if len(derived) > _MAX_LABEL:
            raise ManifestError(
                f"--name {spec.name!r} is too long for {spec.nodes} node(s): pods are addressed as {derived!r}, "
                "and that name must fit in a 63-character DNS-1123 label")
    if spec.namespace is not None:
        check_dns1123_label(spec.namespace, "--namespace")
    if not spec.image or any(character.isspace() for character in spec.image):
        raise ManifestError(f"--image {spec.image!r}: give an image reference without spaces, e.g. "
                            "registry.example.com/team/train:1.0")
    if spec.nodes < 1:
        raise ManifestError(f"--nodes {spec.nodes}: a job needs at least one node")
    if (spec.gpus_per_node is None) == (spec.cpus_per_node is None):
        raise ManifestError("give exactly one of --gpus-per-node and --cpus-per-node")
    if spec.gpus_per_node is not None:
        if spec.gpus_per_node < 1:
            raise ManifestError(f"--gpus-per-node {spec.gpus_per_node}: must be at least 1 (one rank runs per "
                                "GPU); for a job without GPUs use --cpus-per-node")
        if spec.procs_per_node is not None:
            raise ManifestError("--procs-per-node goes with --cpus-per-node; with --gpus-per-node each node "
                                "runs one rank per GPU")
    else:
        check_quantity(spec.cpus_per_node or "", "--cpus-per-node")
        if spec.procs_per_node is not None and spec.procs_per_node < 1:
            raise ManifestError(f"--procs-per-node {spec.procs_per_node}: must be at least 1")
    if spec.memory is not None:
        check_quantity(spec.memory, "--memory")
    check_quantity(spec.shm_size, "--shm-size")
    if not spec.command:
        raise ManifestError("--command is empty: give the training command, e.g. 'python train.py --epochs 3'")
    if not 1 <= spec.port <= 65535:
        raise ManifestError(f"--port {spec.port}: a TCP port is between 1 and 65535")
    _validate_env(spec.env)
    if spec.checkpoint_pvc is not None:
        check_dns1123_subdomain(spec.checkpoint_pvc, "--checkpoint-pvc")
    for key, value in spec.node_selector:
        _validate_label(key, value)
    for secret in spec.image_pull_secrets:
        check_dns1123_subdomain(secret, "--image-pull-secret")
    if spec.backoff_limit is not None and spec.backoff_limit < 0:
        raise ManifestError(f"--backoff-limit {spec.backoff_limit}: must be 0 or more")
    _validate_elastic(spec)


def _validate_env(env: Sequence[tuple[str, str]]) -> None:
    seen: set[str] = set()
    for name, _value in env:
        if not _ENV_NAME.fullmatch(name):
            raise ManifestError(f"--env {name!r}: a variable name is letters, digits, '_', '-' and '.', not "
                                "starting with a digit")
        if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            raise ManifestError(f"--env {name}: set inside the pod by Kubernetes, the training operator or "
                                "torchrun, and rank discovery depends on it; remove it")
        if name in seen:
            raise ManifestError(f"--env {name} is given twice")
        seen.add(name)


def _validate_label(key: str, value: str) -> None:
    prefix, _, name = key.rpartition("/")
    if prefix:
        check_dns1123_subdomain(prefix, "--node-selector key prefix")
    if not (len(name) <= _MAX_LABEL and _LABEL_NAME.fullmatch(name)):
        raise ManifestError(f"--node-selector key {key!r}: a label name is at most 63 letters, digits, '-', '_' "
                            "and '.', starting and ending with a letter or digit (optionally after 'prefix/')")
    if value and not (len(value) <= _MAX_LABEL and _LABEL_NAME.fullmatch(value)):
        raise ManifestError(f"--node-selector value {value!r} of {key}: at most 63 letters, digits, '-', '_' and "
                            "'.', starting and ending with a letter or digit")


def _validate_elastic(spec: K8sJobSpec) -> None:
    if not spec.elastic:
        if spec.max_restarts is not None:
            raise ManifestError("--max-restarts applies to an elastic PyTorchJob (--min-nodes/--max-nodes)")
        return
    if spec.kind != "pytorchjob":
        raise ManifestError("--min-nodes/--max-nodes need --kind pytorchjob (an elastic job needs the training "
                            "operator's c10d rendezvous; an Indexed Job has a fixed size)")
    low, high = spec.node_range
    if not 1 <= low <= spec.nodes <= high:
        raise ManifestError(f"elastic sizes must satisfy 1 <= --min-nodes ({low}) <= --nodes ({spec.nodes}) <= "
                            f"--max-nodes ({high})")
    if spec.max_restarts is not None and spec.max_restarts < 0:
        raise ManifestError(f"--max-restarts {spec.max_restarts}: must be 0 or more")


# -- building blocks -------------------------------------------------------------------------------


def torchrun_program(command: Sequence[str]) -> list[str]:
    """What follows torchrun's own options: ``python train.py -x`` becomes ``train.py -x`` (torchrun runs
    scripts with Python itself), ``python -m pkg`` becomes ``-m pkg``, anything else runs with
    ``--no-python``."""
    command = list(command)
    if _PYTHON.fullmatch(posixpath.basename(command[0])):
        rest = command[1:]
        if rest and rest[0] == "-m" and len(rest) > 1:
            return rest
        if rest and not rest[0].startswith("-"):
            return rest
        return ["--no-python", *command]
    if command[0].endswith(".py"):
        return command
    return ["--no-python", *command]


def labels(spec: K8sJobSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "torchring", "app.kubernetes.io/instance": spec.name}


def metadata(spec: K8sJobSpec, name: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name or spec.name}
    if spec.namespace is not None:
        meta["namespace"] = spec.namespace
    meta["labels"] = labels(spec)
    return meta


def resources(spec: K8sJobSpec) -> dict[str, dict[str, str]]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.gpus_per_node is not None:
        limits["nvidia.com/gpu"] = str(spec.gpus_per_node)
    if spec.cpus_per_node is not None:
        requests["cpu"] = limits["cpu"] = spec.cpus_per_node
    if spec.memory is not None:
        requests["memory"] = limits["memory"] = spec.memory
    result = {}
    if requests:
        result["requests"] = requests
    result["limits"] = limits
    return result


def container_env(spec: K8sJobSpec) -> list[dict[str, Any]]:
    """The Job's completion index (for ``$(JOB_COMPLETION_INDEX)`` in args), defaults, then ``--env``."""
    env: list[dict[str, Any]] = []
    if spec.kind == "job":
        env.append({"name": COMPLETION_INDEX_VARIABLE,
                    "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}})
    given = dict(spec.env)
    defaults = {"HOME": "/tmp"}  # the root filesystem is read-only: caches under $HOME go to /tmp
    if spec.checkpoint_pvc is not None:
        defaults["TORCHRING_CHECKPOINT_DIR"] = CHECKPOINT_MOUNT
    env.extend({"name": name, "value": value} for name, value in defaults.items() if name not in given)
    env.extend({"name": name, "value": value} for name, value in spec.env)
    env.extend(secret_env(spec.name))
    return env


def volumes(spec: K8sJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts): the only writable paths of the pod."""
    pod_volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if spec.checkpoint_pvc is not None:
        pod_volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint_pvc}})
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
    return pod_volumes, mounts


def container(spec: K8sJobSpec, name: str, args: list[str], port_name: str) -> dict[str, Any]:
    _, mounts = volumes(spec)
    return {
        "name": name,
        "image": spec.image,
        "command": ["torchrun"],
        "args": args,
        "env": container_env(spec),
        "ports": [{"name": port_name, "containerPort": spec.port, "protocol": "TCP"}],
        "resources": resources(spec),
        "volumeMounts": mounts,
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def pod_spec(spec: K8sJobSpec, main_container: dict[str, Any], restart_policy: str | None = None,
             subdomain: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    if restart_policy is not None:
        pod["restartPolicy"] = restart_policy
    if subdomain is not None:
        pod["subdomain"] = subdomain
    pod["automountServiceAccountToken"] = False
    pod["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": secret} for secret in spec.image_pull_secrets]
    pod["containers"] = [main_container]
    pod["volumes"] = volumes(spec)[0]
    return pod


# -- the two layouts -------------------------------------------------------------------------------


def job_torchrun_args(spec: K8sJobSpec) -> list[str]:
    """torchrun's arguments in the Indexed Job: the node rank is the pod's completion index."""
    return [
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.ranks_per_node}",
        f"--node-rank=$({COMPLETION_INDEX_VARIABLE})",
        f"--master-addr={spec.master_address}",
        f"--master-port={spec.port}",
        *torchrun_program(spec.command),
    ]


def headless_service(spec: K8sJobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.service_name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # DNS records exist before the pods are Ready
            "selector": labels(spec),
            "ports": [{"name": "rendezvous", "port": spec.port, "targetPort": spec.port, "protocol": "TCP"}],
        },
    }


def indexed_job(spec: K8sJobSpec) -> dict[str, Any]:
    main = container(spec, JOB_CONTAINER, job_torchrun_args(spec), "rendezvous")
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(spec),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.nodes,
            "parallelism": spec.nodes,
            "backoffLimit": spec.effective_backoff_limit,
            "template": {
                "metadata": {"labels": labels(spec)},
                "spec": pod_spec(spec, main, restart_policy="Never", subdomain=spec.service_name),
            },
        },
    }


def pytorchjob(spec: K8sJobSpec) -> dict[str, Any]:
    restart_policy = "OnFailure" if spec.elastic else "Never"

    def replica(count: int) -> dict[str, Any]:
        main = container(spec, PYTORCHJOB_CONTAINER, torchrun_program(spec.command), PYTORCHJOB_PORT_NAME)
        return {
            "replicas": count,
            "restartPolicy": restart_policy,
            "template": {"metadata": {"labels": labels(spec)}, "spec": pod_spec(spec, main)},
        }

    job_spec: dict[str, Any] = {
        "nprocPerNode": str(spec.ranks_per_node),  # a string in kubeflow.org/v1 (it also takes "auto", "gpu")
        "runPolicy": {"backoffLimit": spec.effective_backoff_limit},
    }
    if spec.elastic:
        low, high = spec.node_range
        job_spec["elasticPolicy"] = {
            "minReplicas": low,
            "maxReplicas": high,
            "rdzvBackend": "c10d",
            "rdzvHost": f"{spec.name}-master-0",  # the Master pod's Service; its torchrun hosts the store
            "rdzvPort": spec.port,
            "rdzvId": spec.name,
            "maxRestarts": spec.max_restarts if spec.max_restarts is not None else DEFAULT_MAX_RESTARTS,
        }
    replicas = {"Master": replica(1)}
    if spec.nodes > 1:
        replicas["Worker"] = replica(spec.nodes - 1)
    job_spec["pytorchReplicaSpecs"] = replicas
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata(spec), "spec": job_spec}


def build_manifests(spec: K8sJobSpec, secret: str | None = None) -> list[dict[str, Any]]:
    """The objects to apply, in order: ``[Secret, Service, Job]`` or ``[Secret, PyTorchJob]``; the
    ``Secret`` holds the job's secret (``secret``, or a fresh one; see ``k8s_secret``)."""
    validate_spec(spec)
    objects = [job_secret(spec.name, labels(spec), secret or new_secret_value())]
    if spec.kind == "job":
        return [*objects, headless_service(spec), indexed_job(spec)]
    return [*objects, pytorchjob(spec)]


def render_yaml(objects: Sequence[dict[str, Any]]) -> str:
    """One YAML document per object, keys in the order they were built."""
    return yaml.safe_dump_all(list(objects), sort_keys=False, default_flow_style=False)


def manifest_file_name(obj: dict[str, Any]) -> str:
    """``<kind>-<name>.yaml``, e.g. ``service-mnist.yaml``."""
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
