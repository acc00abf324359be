"""``docker run`` command lines for ranks that run in containers on remote hosts (``torchring run --image``).

The argv built here is meant to travel, like any rank's command, as JSON to the remote supervisor
(:mod:`torchring.launch.spawn.remote_rank`), which runs a command list with an environment dict and no shell.
So every item is a plain string that reaches ``docker`` unchanged: ``-e NAME=VALUE`` needs no quoting
whatever the value holds (spaces, quotes, ``$``, newlines).

Stopping. The supervisor ends a rank by signalling the process group of the ``docker`` client, but the
container belongs to the Docker daemon, not to that client:

* SIGTERM/SIGINT to the client are passed on to the container (``sig_proxy=True``, docker's default without
  a TTY) and reach the rank through ``--init``, whose init process also reaps what the rank leaves behind;
* SIGKILL to the client (or a lost client) does **not** stop the container: it keeps running, holding its
  GPUs and ports. The launcher must therefore run :func:`stop_argv` for every container it started when
  the job ends, fails or is interrupted; ``--rm`` then removes the stopped container, which frees its name.

The rank's environment goes into the container with ``-e``; the ``docker`` client itself runs with the
supervisor's environment, so that must hold what the client needs (``PATH`` to find docker, and
``DOCKER_HOST``/``DOCKER_CONFIG`` where used). ``-e`` values are visible to anyone on that host who can
list processes or run ``docker inspect``: pass no secrets this way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

#: What Docker accepts as a container name.
CONTAINER_NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
#: ``--shm-size`` values: a number with an optional unit (``1g``, ``512m``, ``8GiB``, ``1073741824``).
_SHM_SIZE_RE = re.compile(r"\d+(\.\d+)?[kKmMgGtT]?[iI]?[bB]?")
_JOB_ID_CHARS = 64
#: ``--ulimit stack``: 64 MiB, as NVIDIA recommends for PyTorch containers.
STACK_LIMIT_BYTES = 67108864
STOP_TIMEOUT_S = 5


@dataclass(frozen=True)
class ContainerOptions:
    """How to run each rank's container.

    * ``image``: the image, e.g. ``torchring:cuda`` (built from ``docker/Dockerfile``), present or pullable
      on every host.
    * ``gpus``: ``--gpus all``: every GPU of the host is visible in every container, so the rank picks its
      own by local rank (``torch.cuda.set_device(hvd.local_rank())``) as it would without containers.
      ``None`` (the default) decides per host: ``--gpus all`` where :func:`host_has_nvidia_gpus` (on a host
      without GPUs, Docker refuses ``--gpus``); resolve it with :meth:`for_host` before building an argv.
    * ``shm_size``: ``None`` shares the host's IPC namespace (``--ipc=host``): a large ``/dev/shm`` for
      DataLoader workers, and ranks on one host (one container each) can use NCCL's shared-memory and CUDA
      IPC transports between them. A size (``"8g"``) gives each container a private ``/dev/shm`` of that
      size instead, where host IPC is not allowed.
    * ``network_host``: ``--network host``: ranks reach the launcher's store and each other's Gloo/NCCL
      ports at the host's own addresses, on ephemeral ports that a bridge network would have to publish.
    * ``volumes``: ``-v`` values (``/data:/data:ro``); the images run as uid 1000, which must be able to
      read (and write, where the job writes) them.
    * ``extra_args``: more ``docker run`` options, placed just before the image (``--device``, ``--user``).
    """

    image: str
    gpus: bool | None = None
    shm_size: str | None = None
    network_host: bool = True
    volumes: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image or self.image.startswith("-") or _has_space(self.image):
            raise ValueError(f"container image must be an image reference such as 'torchring:cuda', got {self.image!r}")
        if self.shm_size is not None and not _SHM_SIZE_RE.fullmatch(str(self.shm_size)):
            raise ValueError(f"shm_size must be a size such as '8g' or '512m', got {self.shm_size!r}")
        for field, items in (("volumes", self.volumes), ("extra_args", self.extra_args)):
            if isinstance(items, str) or not all(isinstance(item, str) for item in items):
                raise TypeError(f"{field} must be a sequence of strings, got {items!r}")
            object.__setattr__(self, field, tuple(items))
        for volume in self.volumes:
            if not volume or volume.startswith("-"):
                raise ValueError(f"not a volume (-v) value: {volume!r}")


    def for_host(self, has_nvidia_gpus: bool) -> ContainerOptions:
        """These options on a host with or without NVIDIA GPUs: ``gpus`` None becomes that answer."""
        return self if self.gpus is not None else dataclasses.replace(self, gpus=has_nvidia_gpus)


def host_has_nvidia_gpus() -> bool:
    """Whether this host has NVIDIA's driver loaded with devices (``/dev/nvidiactl``): what ``--gpus all``
    needs, besides the NVIDIA Container Toolkit."""
    return os.path.exists("/dev/nvidiactl")


def _has_space(text: str) -> bool:
    return any(character.isspace() for character in text)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not CONTAINER_NAME_RE.fullmatch(name):
        raise ValueError(f"not a valid container name (letters, digits, '_', '.', '-'; starting with a letter or "
                         f"digit): {name!r}")
    return name


def container_name(job_id: str, rank: int, role: str = "rank") -> str:
    """The container name of ``rank`` in job ``job_id``: ``torchring-<job id>-rank<N>`` (``role`` "worker"
    names elastic worker N instead: ``torchring-<job id>-worker<N>``).

    Characters Docker does not allow in names become ``-``; when the job id had to change (or was cut to
    64 characters), a short hash of the original is added, so different job ids keep different names.
    """
    if not isinstance(job_id, str) or not job_id:
        raise ValueError(f"job_id must be a non-empty string, got {job_id!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative integer, got {rank!r}")
    if role not in ("rank", "worker"):
        raise ValueError(f"role must be 'rank' or 'worker', got {role!r}")
    cleaned = re.sub(r"[^a-zA-Z0-9_.-]+", "-", job_id).strip("-_.")[:_JOB_ID_CHARS]
    if cleaned != job_id:
        digest = hashlib.sha1(job_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cleaned = f"{cleaned}-{digest}" if cleaned else digest
    return _check_name(f"torchring-{cleaned}-{role}{rank}")


def docker_run_argv(options: ContainerOptions, command: Sequence[str], env: Mapping[str, str], workdir: str,
                    name: str, *, sig_proxy: bool = True, docker: str = "docker",
                    from_client: Collection[str] = ()) -> list[str]:
    """The argv that runs ``command`` as one rank in a container::

        docker run --rm --init --name NAME [--sig-proxy=false]
            [--gpus all --ulimit memlock=-1 --ulimit stack=67108864] (--ipc=host | --shm-size SIZE)
            [--network host] -e NAME=VALUE... -v VOLUME...
            -w WORKDIR [EXTRA_ARGS...] IMAGE COMMAND...

    ``--rm`` removes the container once it ends; ``--init`` runs an init process as PID 1 that passes
    signals on to the rank and reaps its children. With GPUs, ``memlock=-1`` lets NCCL (and RDMA) pin memory
    and the stack limit is NVIDIA's recommended one; CPU containers keep the daemon's limits (raising
    memlock needs privileges a rootless or restricted daemon lacks, and Gloo does not pin memory). ``env``
    is the rank's whole environment inside the container (the image's own variables, such as ``PATH``, apply
    where ``env`` does not set them); the variables named in ``from_client`` are passed as ``-e NAME``
    alone, so docker takes their values from its own environment and they never appear on a command line
    (the job's secret). The launcher must run :func:`stop_argv` on teardown: killing this client does not
    stop the container (see the module's docstring). ``docker`` may name another client with the same
    options (a path, ``podman``).
    """
    if isinstance(command, str) or not command or not all(isinstance(item, str) for item in command):
        raise ValueError(f"command must be a non-empty list of strings, got {command!r}")
    if not isinstance(workdir, str) or not workdir.startswith("/"):
        raise ValueError(f"workdir must be an absolute path inside the container, got {workdir!r}")
    if options.gpus is None:
        raise ValueError("options.gpus is None (decided per host): call options.for_host(...) first")
    argv = [docker, "run", "--rm", "--init", "--name", _check_name(name)]
    if not sig_proxy:
        argv.append("--sig-proxy=false")
    if options.gpus:
        argv += ["--gpus", "all", "--ulimit", "memlock=-1", "--ulimit", f"stack={STACK_LIMIT_BYTES}"]
    argv += ["--ipc=host"] if options.shm_size is None else ["--shm-size", str(options.shm_size)]
    if options.network_host:
        argv += ["--network", "host"]
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"not an environment variable name: {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"environment value of {key} must be a string without NUL, got {value!r}")
        argv += ["-e", key if key in from_client else f"{key}={value}"]
    for volume in options.volumes:
        argv += ["-v", volume]
    argv += ["-w", workdir, *options.extra_args, options.image, *command]
    return argv


def stop_argv(name: str, timeout_s: int = STOP_TIMEOUT_S, *, docker: str = "docker") -> list[str]:
    """``docker stop -t 5 NAME``: SIGTERM to the container's init (and so to the rank), SIGKILL after
    ``timeout_s`` seconds; with ``--rm`` the container is then removed. Run it on every host that started a
    container, whatever happened to the ``docker run`` client; a container already gone makes it fail
    harmlessly (exit code 1, "No such container")."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 0:
        raise ValueError(f"timeout_s must be a non-negative integer, got {timeout_s!r}")
    return [docker, "stop", "-t", str(timeout_s), _check_name(name)]
