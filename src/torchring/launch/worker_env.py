"""The environment each worker starts with: torchring, Horovod and torchrun variables."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..contract import (
    CROSS_RANK,
    CROSS_SIZE,
    HOSTNAME,
    LOCAL_RANK,
    LOCAL_SIZE,
    RANK,
    SIZE,
    STORE_ADDR,
    STORE_PORT,
    horovod_name,
)
from .hosts import SlotAssignment


def worker_environment(base: Mapping[str, str], slot: SlotAssignment, store_host: str, store_port: int,
                       cpus: int | None = None) -> dict[str, str]:
    """``base`` plus everything rank ``slot.rank`` needs to find its place and the rendezvous store."""
    env = dict(base)
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
        env[name] = env[horovod_name(name)] = str(value)
    env[STORE_ADDR] = store_host
    env[STORE_PORT] = str(store_port)
    # torchrun's variables, so that init_process_group(init_method="env://") works unchanged; the
    # launcher serves the store, as torchrun's agent does.
    env.update(
        RANK=str(slot.rank),
        WORLD_SIZE=str(slot.size),
        LOCAL_RANK=str(slot.local_rank),
        LOCAL_WORLD_SIZE=str(slot.local_size),
        GROUP_RANK=str(slot.host_index),
        GROUP_WORLD_SIZE=str(slot.num_hosts),
        ROLE_RANK=str(slot.rank),
        ROLE_WORLD_SIZE=str(slot.size),
        MASTER_ADDR=store_host,
        MASTER_PORT=str(store_port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    if "OMP_NUM_THREADS" not in env:
        available = cpus or os.cpu_count() or 1
        env["OMP_NUM_THREADS"] = str(max(1, available // max(1, slot.local_size)))
    return env


#: Variables a remote rank inherits from the launcher's environment, by name or by prefix.
FORWARDED_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED")
FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "HOROVOD_", "TORCHRING_")


def forwarded_environment(environ: Mapping[str, str], extra_names: list[str],
                          extra_values: dict[str, str]) -> dict[str, str]:
    """What a remote rank gets from here: the usual variables, ``-x NAME`` ones and ``--env NAME=VALUE``."""
    env = {name: value for name, value in environ.items()
           if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES) or name in extra_names}
    env.update(extra_values)
    return env
