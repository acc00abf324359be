"""The environment each worker starts with: torchring, Horovod and torchrun variables.

Built once, here, for fixed and elastic jobs alike: :class:`EnvironmentPlan` gives the part that depends
on where the process runs (all of the launcher's environment on this host, the forwarded part on remote
hosts and in containers, ``--env`` values and interface variables everywhere); :func:`rank_environment`
adds the rendezvous store and the per-process defaults on top of a job mode's own variables
(:func:`topology_variables` for a fixed rank, :func:`elastic_variables` for an elastic worker).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...contract import (
    CROSS_RANK,
    CROSS_SIZE,
    ELASTIC,
    ELASTIC_TIMEOUT,
    HOSTNAME,
    JOB_SECRET,
    LOCAL_RANK,
    LOCAL_SIZE,
    RANK,
    RESET_LIMIT,
    SIZE,
    STORE_ADDR,
    STORE_PORT,
    WORKER_ID,
    horovod_name,
)
from ...store_auth import JobCredentials
from ..hosts import SlotAssignment


class Placement(enum.Enum):
    """Where a process runs, which decides what of the launcher's environment it gets."""

    LOCAL = "local"
    SSH = "ssh"
    CONTAINER = "container"
    #: A Ray actor (``torchring.ray``): its environment is built by the Ray starter, not from this plan.
    RAY = "ray"


#: Variables a remote rank inherits from the launcher's environment, by name or by prefix.
FORWARDED_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED")
FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "HOROVOD_", "TORCHRING_")
#: Host paths that mean nothing inside a container image: the image's own values apply there (unless
#: ``--env`` sets them).
HOST_ONLY_VARIABLES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")


def forwarded_environment(environ: Mapping[str, str], extra_names: list[str],
                          extra_values: dict[str, str]) -> dict[str, str]:
    """What a remote rank gets from here: the usual variables, ``-x NAME`` ones and ``--env NAME=VALUE``."""
    env = {name: value for name, value in environ.items()
           if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES) or name in extra_names}
    env.update(extra_values)
    return env


@dataclass(frozen=True)
class EnvironmentPlan:
    """What every process's environment is made of.

    ``launcher`` is the launcher's environment with the tuning flags' variables; ``forward_names`` the
    ``-x`` names; ``extra`` the ``--env`` values; ``network_interfaces`` the ``--network-interface`` names.
    """

    launcher: Mapping[str, str]
    forward_names: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)
    network_interfaces: tuple[str, ...] = ()

    def base(self, placement: Placement, interface: str | None = None) -> dict[str, str]:
        """The environment before the job's own variables: everything for a process on this host, the
        forwarded part elsewhere (without host paths in a container); ``--env`` values win. ``interface``
        (the one the hosts reach each other through) becomes ``GLOO_SOCKET_IFNAME`` unless
        ``--network-interface`` or the environment set it."""
        if placement is Placement.LOCAL:
            env = dict(self.launcher)
        else:
            env = forwarded_environment(self.launcher, list(self.forward_names), {})
        if placement is Placement.CONTAINER:
            env = {key: value for key, value in env.items() if key not in HOST_ONLY_VARIABLES}
        env.update(self.extra)
        if self.network_interfaces:
            names = ",".join(self.network_interfaces)
            env.setdefault("GLOO_SOCKET_IFNAME", names)
            env.setdefault("NCCL_SOCKET_IFNAME", names)
        elif interface:
            env.setdefault("GLOO_SOCKET_IFNAME", interface)
        return env


def topology_variables(slot: SlotAssignment) -> dict[str, str]:
    """A fixed rank's place: torchring's and Horovod's variables, and torchrun's (so that
    ``init_process_group(init_method="env://")`` works unchanged; the launcher serves the store, as
    torchrun's agent does)."""
    variables: dict[str, str] = {}
    topology = {
        RANK: slot.rank,
        SIZE: slot.size,
        LOCAL_RANK: slot.local_rank,
        LOCAL_SIZE: slot.local_size,
        CROSS_RANK: slot.cross_rank,
        CROSS_SIZE: slot.cross_size,
        HOSTNAME: slot.hostname,
    }
    for name, value in topology.items():
        variables[name] = variables[horovod_name(name)] = str(value)
    variables.update(
        RANK=str(slot.rank),
        WORLD_SIZE=str(slot.size),
        LOCAL_RANK=str(slot.local_rank),
        LOCAL_WORLD_SIZE=str(slot.local_size),
        GROUP_RANK=str(slot.host_index),
        GROUP_WORLD_SIZE=str(slot.num_hosts),
        ROLE_RANK=str(slot.rank),
        ROLE_WORLD_SIZE=str(slot.size),
        TORCHELASTIC_USE_AGENT_STORE="True",
        # torch 2.4's env:// reads it whenever the agent serves the store (torchrun sets it too)
        TORCHELASTIC_RESTART_COUNT="0",
    )
    return variables


def elastic_variables(worker_id: str, hostname: str, elastic_timeout_s: float,
                      reset_limit: int | None) -> dict[str, str]:
    """An elastic worker's identity; its rank and size come from the store, generation by generation."""
    variables = {ELASTIC: "1", WORKER_ID: worker_id, HOSTNAME: hostname, ELASTIC_TIMEOUT: str(elastic_timeout_s)}
    if reset_limit is not None:
        variables[RESET_LIMIT] = str(reset_limit)
    return variables


def rank_environment(base: Mapping[str, str], variables: Mapping[str, str], store_host: str, store_port: int,
                     local_size: int, cpus: int | None = None,
                     credentials: JobCredentials | None = None) -> dict[str, str]:
    """``base`` plus a process's own ``variables``, where the rendezvous store is, the job's
    ``credentials`` (its id and secret), and the defaults ``PYTHONUNBUFFERED=1`` and
    ``OMP_NUM_THREADS`` = CPUs / processes on the host."""
    env = dict(base)
    env.pop(JOB_SECRET, None)  # never another job's secret, inherited from the launcher's environment
    env.update(variables)
    env.update({STORE_ADDR: store_host, STORE_PORT: str(store_port), "MASTER_ADDR": store_host,
                "MASTER_PORT": str(store_port)})
    if credentials is not None:
        env.update(credentials.environment())
    env.setdefault("PYTHONUNBUFFERED", "1")
    if "OMP_NUM_THREADS" not in env:
        available = cpus or os.cpu_count() or 1
        env["OMP_NUM_THREADS"] = str(max(1, available // max(1, local_size)))
    return env
