"""``horovod.torch.mpi_ops``: the collectives and handles, where some scripts import them from."""

from torchring.collectives import (  # noqa: F401
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
from torchring.reduction import Adasum, Average, Max, Min, Product, Sum  # noqa: F401
