"""The ranks meet in the rendezvous store before any process group is used: every rank posts its arrival
with what the topology needs (its host name and what its environment said about local and cross ranks)
and its engine values that every rank must share. Then, in a job of up to
:data:`DIRECT_MEETING_MAX_RANKS` ranks, every rank waits for all arrivals and derives every rank's
topology itself: one wake-up of every rank, as a bare ``init_process_group`` has, for ``N`` small reads
per rank (``N²`` in all, what a Gloo full mesh reads too). In a larger job rank 0 alone waits for every
arrival, derives every rank's topology (``O(N)``) and posts each rank its own answer with rank 0's shared
values: each rank reads one small answer whatever the job's size, for one wake-up more (rank 0 reads
``N`` arrivals and writes ``N`` answers, as the coordinator of the control plane does).

No process-group connection either way. Values are JSON and signed with the job's secret
(``store_auth``); an arrival or answer another process wrote is refused with its key named. A rank that
never comes is named in the error, after the start timeout (``TORCHRING_START_TIMEOUT``), not the
collective timeout.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch.distributed as dist

from ..environments import RankInfo
from ..store_auth import AuthenticatedStore
from .coordination.topology import Topology, derive_topologies
from .peer_names import encode_host_table, host_table_key

__all__ = ["DIRECT_MEETING_MAX_RANKS", "meet"]

#: Up to this many ranks every rank reads every arrival itself (see the module's docstring). Beyond, rank 0's
#: answer costs one wake-up more but spares every other rank ``N`` reads, checks and decodes after the last
#: arrival, when all of them wake at once: init() plus the first barrier, alternating jobs on 2 cores, 132
#: against 150 ms at 32 ranks (14 pairs, 11 won), 50 against 55 at 16, 26.5 against 30.5 at 8, level at 4.
DIRECT_MEETING_MAX_RANKS = 4


def _arrival_key(prefix: str, rank: int) -> str:
    return f"{prefix}/arrived/{rank}"


def _answer_key(prefix: str, rank: int) -> str:
    return f"{prefix}/topology/{rank}"


def meet(store: AuthenticatedStore, prefix: str, info: RankInfo, shared: Sequence[int], timeout: timedelta,
         before_arrival: Callable[[], None] | None = None) -> tuple[Topology, list[tuple[int, ...]]]:
    """This rank's topology and the shared engine values: every rank's on rank 0 (in rank order), rank 0's
    alone elsewhere. Every rank of the job calls it once per generation ``prefix``. ``before_arrival`` runs
    before this rank's arrival is posted (start-up work that needs no answer: the last rank to arrive does it
    before the others wake up, not while they compete for the CPU)."""
    hostname = info.hostname or socket.gethostname()
    mine = [hostname, info.local_rank, info.local_size, info.cross_rank, info.cross_size]
    if before_arrival is not None:
        before_arrival()
    if info.size > 1:
        store.set(_arrival_key(prefix, info.rank), json.dumps([mine, list(shared)]))
    if info.size == 1:
        return derive_topologies([tuple(mine)])[0], [tuple(shared)]
    if info.size <= DIRECT_MEETING_MAX_RANKS:
        topologies, shared_values = _read_everyone(store, prefix, info.size, timeout)
        if info.rank == 0:
            store.set(host_table_key(prefix), _host_table(topologies))
        return topologies[info.rank], shared_values if info.rank == 0 else shared_values[:1]
    if info.rank == 0:
        topologies, shared_values = _read_everyone(store, prefix, info.size, timeout)
        keys = [_answer_key(prefix, r) for r in range(1, info.size)] + [host_table_key(prefix)]
        answers = [json.dumps([t.local_rank, t.local_size, t.cross_rank, t.cross_size, t.homogeneous,
                               shared_values[0]]) for t in topologies[1:]]
        store.set_many(keys, [*answers, _host_table(topologies)])
        return topologies[0], shared_values
    answer = _wait_and_read(store, [_answer_key(prefix, info.rank)], prefix, info.size, timeout)[0]
    local_rank, local_size, cross_rank, cross_size, homogeneous, rank0_shared = answer
    topology = Topology(info.rank, info.size, local_rank, local_size, cross_rank, cross_size, hostname,
                        bool(homogeneous))
    return topology, [tuple(rank0_shared)]


def _read_everyone(store: AuthenticatedStore, prefix: str, size: int,
                   timeout: timedelta) -> tuple[list[Topology], list[tuple[int, ...]]]:
    """Every rank's topology and shared values, in rank order, once every rank has arrived."""
    arrivals = _wait_and_read(store, [_arrival_key(prefix, r) for r in range(size)], prefix, size, timeout)
    try:
        topologies = derive_topologies([tuple(arrival[0]) for arrival in arrivals])
    except ValueError as error:
        raise RuntimeError(f"torchring cannot derive the job's topology: {error}. Check the LOCAL_RANK and "
                           "LOCAL_WORLD_SIZE (or the scheduler's) variables of every rank.") from None
    return topologies, [tuple(arrival[1]) for arrival in arrivals]


def _host_table(topologies: list[Topology]) -> str:
    """The job's host table (``peer_names``), which rank 0 writes for naming peers in errors."""
    return encode_host_table([str(topology.hostname) for topology in topologies])


def _wait_and_read(store: AuthenticatedStore, keys: list[str], prefix: str, size: int,
                   timeout: timedelta) -> list:
    """The verified JSON values of ``keys``, once they all exist."""
    try:
        store.raw.wait(keys, timeout)
    except dist.DistStoreError:
        missing = [r for r in range(size) if not store.check([_arrival_key(prefix, r)])]
        if not missing:
            raise RuntimeError(f"torchring rendezvous timed out after {timeout.total_seconds():.0f}s: every "
                               "rank arrived but rank 0 never answered. Check rank 0's output.") from None
        raise RuntimeError(
            f"torchring rendezvous timed out after {timeout.total_seconds():.0f}s: rank(s) {missing} of "
            f"{size} never called hvd.init(). Check their output; raise TORCHRING_START_TIMEOUT if they start slowly."
        ) from None
    multi_get = getattr(store.raw, "multi_get", None)
    raw_values = multi_get(keys) if multi_get is not None and len(keys) > 1 else [store.raw.get(k) for k in keys]
    values = []
    for key, raw in zip(keys, raw_values, strict=True):
        value = store.verified(key, bytes(raw))
        if value is None:
            raise RuntimeError(f"torchring rendezvous: the value of {key!r} in the store was not written by this "
                               "job (not signed with its secret); another process may be using the same "
                               "store address. Start the job again on a free port.")
        values.append(json.loads(value))
    return values
