"""Lifecycle and topology queries of the Horovod API."""

from __future__ import annotations

from .collectives import reset_auto_names
from .runtime import context


def init(comm: object = None, process_sets: object = None) -> None:
    """Join the job: discover ranks from the environment, rendezvous, and start the engine.

    Does nothing when already initialised; after ``shutdown()`` it starts a fresh rendezvous.
    ``comm`` (an MPI communicator in Horovod) and ``process_sets`` are not supported yet.
    """
    if comm is not None:
        raise ValueError("init(comm=...) needs MPI, which torchring does not use; launch the ranks with "
                         "torchring run, torchrun, srun or mpirun and call init() without arguments")
    if process_sets is not None:
        raise NotImplementedError("process sets are not supported by this version of torchring")
    if not context.is_initialized():
        context.init()
        reset_auto_names()


shutdown = context.shutdown
is_initialized = context.is_initialized


def size() -> int:
    """Number of ranks in the job."""
    return context.current().topology.size


def rank() -> int:
    """This process's rank, from 0 to ``size() - 1``."""
    return context.current().topology.rank


def local_size() -> int:
    """Number of ranks on this host."""
    return context.current().topology.local_size


def local_rank() -> int:
    """This process's rank among the ranks of its host (use it to pick the GPU)."""
    return context.current().topology.local_rank


def cross_size() -> int:
    """Number of hosts that run a rank with this process's local rank."""
    return context.current().topology.cross_size


def cross_rank() -> int:
    """This host's index among the hosts that run a rank with this process's local rank."""
    return context.current().topology.cross_rank
