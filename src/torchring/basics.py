"""Lifecycle and topology queries of the Horovod API."""

from __future__ import annotations

from collections.abc import Sequence

from .process_sets import ProcessSet, global_process_set
from .runtime import context
from .runtime.names import reset_auto_names
from .settings import Settings


def init(comm: object = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Join the job: discover ranks from the environment, rendezvous, and start the engine.

    ``process_sets``: a list of ``ProcessSet`` every rank registers now, or ``"dynamic"`` to allow
    ``add_process_set``/``remove_process_set`` later (as does ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).
    Does nothing when already initialised; after ``shutdown()`` it starts a fresh rendezvous.
    """
    if comm is not None:
        raise ValueError("init(comm=...) needs MPI, which torchring does not use; launch the ranks with "
                         "torchring run, torchrun, srun or mpirun and call init() without arguments")
    if context.is_initialized():
        return
    settings = Settings.from_env()
    dynamic = process_sets == "dynamic" or settings.dynamic_process_sets
    static = [] if process_sets is None or isinstance(process_sets, str) else list(process_sets)
    if isinstance(process_sets, str) and process_sets != "dynamic":
        raise ValueError(f"process_sets must be a list of ProcessSet or 'dynamic', got {process_sets!r}")
    for process_set in static:
        if not isinstance(process_set, ProcessSet):
            raise ValueError(f"process_sets must hold ProcessSet objects, got {type(process_set).__name__}")
    # loaded now, while the ranks still arrive one by one: loaded by the first operation after init(), every
    # rank paid its ~1 ms of CPU at the same moment (32 ranks on 2 cores: 15-20 ms of the first barrier)
    from . import collectives  # noqa: F401
    ids = context.init([tuple(ps.ranks) for ps in static], dynamic, settings)
    for process_set, process_set_id in zip(static, ids, strict=True):
        process_set.process_set_id = process_set_id
    global_process_set.ranks = list(range(context.current().topology.size))
    reset_auto_names()


shutdown = context.shutdown
is_initialized = context.is_initialized


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record a Chrome-trace timeline of every operation into ``file_path`` (written by rank 0)."""
    context.start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop recording the timeline; the file is left as valid JSON."""
    context.stop_timeline()


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


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return context.current().topology.homogeneous
