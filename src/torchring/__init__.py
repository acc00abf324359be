"""torchring: Horovod's PyTorch API on torch.distributed.

Use it as ``import torchring as hvd``: ``hvd.init()``, ``hvd.DistributedOptimizer``,
``hvd.broadcast_parameters`` and the collectives behave as Horovod documents them.
"""

from .basics import (
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
from .collectives import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    poll,
    synchronize,
)
from .compression import Compression
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, TensorMismatchError
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .optimizer import DistributedOptimizer
from .reduction import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from .version import __version__

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "Product",
    "ReduceOp",
    "Sum",
    "TensorMismatchError",
    "__version__",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "poll",
    "rank",
    "shutdown",
    "size",
    "synchronize",
]
