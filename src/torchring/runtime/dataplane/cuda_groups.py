"""The process group that moves a process set's CUDA tensors, and how it fails.

NCCL by default (one GPU per rank). Its own timeout is torchring's ``TORCHRING_NCCL_TIMEOUT_SECONDS`` (600
s, DDP's default), not the Gloo timeout: a gradient lane starts its collectives without negotiation, so a
rank that is legitimately behind (evaluation, a checkpoint written by rank 0) must not fail the others
after 30 s. When a collective does fail or time out, torch's watchdog would by default tear the process
down, with nothing to catch; torchring asks it to abort the communicator only
(``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``, unless the job set it), so the error surfaces from the work's
``wait()`` as an exception, which the engine and the lanes raise as ``HorovodInternalError`` on the rank:
the launcher can blame the rank that stopped and an elastic job can roll back and go on.

``TORCHRING_CUDA_BACKEND=gloo`` moves CUDA tensors through the set's Gloo group instead (Gloo accepts CUDA
tensors for allreduce, broadcast and allgather): slower, but it runs several ranks on one GPU, which NCCL
refuses; ``make gpu-check`` uses it on a machine with one GPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ... import settings

__all__ = ["ASYNC_ERROR_HANDLING", "CudaGroupSettings", "cuda_group", "nccl_options", "prepare_nccl_error_handling"]

logger = logging.getLogger("torchring")

#: torch's variable for what NCCL's watchdog does with a failed or timed-out collective.
ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
#: Its "clean up only" mode: abort the communicator and raise from ``wait()``; never kill the process.
CLEAN_UP_ONLY = "2"


@dataclass(frozen=True)
class CudaGroupSettings:
    """Which backend moves CUDA tensors and how long one NCCL collective may take."""

    backend: str = "nccl"
    timeout: timedelta = timedelta(seconds=600)

    @classmethod
    def read(cls, env: MutableMapping[str, str] | None = None) -> CudaGroupSettings:
        return cls(settings.read("CUDA_BACKEND", env), timedelta(seconds=settings.read("NCCL_TIMEOUT_SECONDS", env)))


def prepare_nccl_error_handling(env: MutableMapping[str, str] | None = None) -> str:
    """Before an NCCL group is made: a failed collective aborts its communicator and raises, unless the job
    chose otherwise (``TORCH_NCCL_ASYNC_ERROR_HANDLING``, or the older ``NCCL_ASYNC_ERROR_HANDLING``).
    Returns the mode in effect."""
    env = os.environ if env is None else env
    chosen = env.get(ASYNC_ERROR_HANDLING) or env.get("NCCL_ASYNC_ERROR_HANDLING")
    if chosen:
        return chosen
    env[ASYNC_ERROR_HANDLING] = CLEAN_UP_ONLY
    return CLEAN_UP_ONLY


def nccl_options(timeout: timedelta) -> Any:
    """``ProcessGroupNCCL.Options`` with ``timeout`` (torch builds without NCCL have no such class)."""
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return options


def cuda_group(store: dist.Store, rank: int, size: int, cpu_group: dist.ProcessGroup | None,
               config: CudaGroupSettings | None = None) -> dist.ProcessGroup | None:
    """The group for the set's CUDA tensors: ``cpu_group`` itself with the Gloo backend, else a new NCCL
    group (None where this torch has no CUDA or no NCCL: CUDA collectives then fail with a clear error)."""
    config = config or CudaGroupSettings.read()
    if config.backend == "gloo":
        return cpu_group
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    prepare_nccl_error_handling()
    try:
        return dist.ProcessGroupNCCL(store, rank, size, nccl_options(config.timeout))
    except (RuntimeError, AttributeError, TypeError) as error:
        logger.warning("NCCL is unavailable (%s); collectives on CUDA tensors will fail", error)
        return None
