"""torchring: Horovod's PyTorch API on torch.distributed.

Use it as ``import torchring as hvd``: ``hvd.init()``, ``hvd.DistributedOptimizer``,
``hvd.broadcast_parameters`` and the collectives behave as Horovod documents them.

The API is loaded on first use (``hvd.init`` loads it, and torch with it), so that the tools that need
no torch start quickly: the rank supervisor that ``torchring run`` starts on every remote host and for
every container rank (``python -m torchring.launch.spawn.remote_rank``) would otherwise spend about 2 s of CPU
importing torch before it starts its rank. ``from torchring import *`` and ``dir(torchring)`` list the
whole API as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

#: Where each public name lives (module of this package -> names).
_API: dict[str, tuple[str, ...]] = {
    "basics": ("cross_rank", "cross_size", "init", "is_homogeneous", "is_initialized", "local_rank", "local_size",
               "rank", "shutdown", "size", "start_timeline", "stop_timeline"),
    "capabilities": ("ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "mpi_built",
                     "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built"),
    "collectives": ("allgather", "allgather_async", "allreduce", "allreduce_", "allreduce_async",
                    "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_",
                    "broadcast_async", "broadcast_async_", "join", "poll", "reducescatter", "reducescatter_async",
                    "sparse_allreduce_async", "synchronize"),
    "compression": ("Compression",),
    "exceptions": ("HorovodInternalError", "HostsUpdatedInterrupt", "TensorMismatchError"),
    "function_job": ("run",),
    "functions": ("allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"),
    "grouped": ("grouped_allgather", "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
                "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
                "grouped_reducescatter_async"),
    "logging_utils": ("get_logger", "progress"),
    "optimizer": ("DistributedOptimizer",),
    "process_sets": ("ProcessSet", "add_process_set", "global_process_set", "remove_process_set"),
    "reduction": ("Adasum", "Average", "Max", "Min", "Product", "ReduceOp", "Sum"),
    "sync_batch_norm": ("SyncBatchNorm",),
}
_MODULE_OF = {name: module for module, names in _API.items() for name in names}

__all__ = sorted([*_MODULE_OF, "__version__", "elastic"])

if TYPE_CHECKING:  # what type checkers and editors see: the same names, imported eagerly
    from . import elastic
    from .basics import (
        cross_rank,
        cross_size,
        init,
        is_homogeneous,
        is_initialized,
        local_rank,
        local_size,
        rank,
        shutdown,
        size,
        start_timeline,
        stop_timeline,
    )
    from .capabilities import (
        ccl_built,
        cuda_built,
        ddl_built,
        gloo_built,
        gloo_enabled,
        mpi_built,
        mpi_enabled,
        mpi_threads_supported,
        nccl_built,
        rocm_built,
    )
    from .collectives import (
        allgather,
        allgather_async,
        allreduce,
        allreduce_,
        allreduce_async,
        allreduce_async_,
        alltoall,
        alltoall_async,
        barrier,
        broadcast,
        broadcast_,
        broadcast_async,
        broadcast_async_,
        join,
        poll,
        reducescatter,
        reducescatter_async,
        sparse_allreduce_async,
        synchronize,
    )
    from .compression import Compression
    from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError
    from .function_job import run
    from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
    from .grouped import (
        grouped_allgather,
        grouped_allgather_async,
        grouped_allreduce,
        grouped_allreduce_,
        grouped_allreduce_async,
        grouped_allreduce_async_,
        grouped_reducescatter,
        grouped_reducescatter_async,
    )
    from .logging_utils import get_logger, progress
    from .optimizer import DistributedOptimizer
    from .process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
    from .reduction import Adasum, Average, Max, Min, Product, ReduceOp, Sum
    from .sync_batch_norm import SyncBatchNorm


def __getattr__(name: str) -> Any:
    """Load a public name (or the ``elastic`` subpackage: ``hvd.elastic.run``) on first use."""
    if name == "elastic":
        return importlib.import_module(".elastic", __name__)
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
