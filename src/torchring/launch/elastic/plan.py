"""The elastic driver's membership rules, free of processes, stores and clocks: given its workers, the
published generation and the free slots, what it does next.

The rules, applied on every pass of the driver's loop (so that every interleaving of lost workers,
hosts leaving and hosts arriving ends in a generation that trains, or in a wait for hosts):

* A generation's members are workers that are **really running**. A worker that ended, or that the
  driver is stopping (its host left the pool), is not running; a generation that holds one is
  *broken* and a new one is due, whatever else happened in the same pass.
* The job wants ``min(max_np, running members + running spares + free slots)`` members. A new
  generation is due when there is none yet, when the current one is broken, or when the job can grow.
* Below the minimum (``--min-np``, or ``-np`` for the first generation) no generation is published:
  the driver waits for hosts (up to ``--elastic-timeout``) and the waiting workers stay in ``hvd.init()``.
* Places go to the running members first, then to hot spares (those already standing by first), then
  to new workers started on free slots.
* Free slots left after that take hot spares, up to ``--spares``: spares never take a slot a member
  could use (``max_np`` caps members, not spares), and starting one is not a membership change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...environments.base import RankInfo

Slot = tuple[str, int]


@dataclass(frozen=True)
class WorkerView:
    """What the rules need to know of one worker."""

    worker_id: str
    host: str
    slot: int
    #: Alive, and not being stopped by the driver.
    running: bool
    #: Holds a place in the published generation.
    member: bool
    #: A hot spare that has said it stands by (``hvd.init()`` reached, torch imported).
    standing_by: bool = False


@dataclass(frozen=True)
class Plan:
    """The driver's next moves."""

    #: A new generation is due now.
    publish: bool
    #: The existing workers that hold its places (running members, then promoted spares), by worker id.
    members: tuple[str, ...] = ()
    #: Spares among ``members`` (they leave the standby pool).
    promoted: tuple[str, ...] = ()
    #: Free slots that get new workers for the new generation.
    start_members: tuple[Slot, ...] = ()
    #: Free slots that get new hot spares.
    start_spares: tuple[Slot, ...] = ()
    #: Below the minimum: how many workers the job needs (a new generation is due but cannot be made).
    waiting_for: int | None = None
    #: The current generation holds a worker that is no longer running.
    broken: bool = False


def plan_membership(workers: Sequence[WorkerView], has_generation: bool, free_slots: Sequence[Slot],
                    max_np: int, needed: int, spares: int) -> Plan:
    """The next moves for ``workers`` (each running worker, and each member of the published generation
    whether running or not), ``free_slots`` (usable slots no running worker holds, in discovery order),
    ``needed`` workers at least and at most ``max_np``, keeping ``spares`` hot spares."""
    members = [w for w in workers if w.member and w.running]
    standby = sorted((w for w in workers if not w.member and w.running), key=lambda w: not w.standing_by)
    broken = any(w.member and not w.running for w in workers)
    target = min(max_np, len(members) + len(standby) + len(free_slots))
    due = not has_generation or broken or target > len(members)
    free = list(free_slots)
    if due and target < needed:
        return Plan(publish=False, waiting_for=needed, broken=broken)
    promoted: list[WorkerView] = []
    start_members: list[Slot] = []
    if due:
        promoted = standby[:target - len(members)]
        standby = standby[len(promoted):]
        count = target - len(members) - len(promoted)
        start_members, free = free[:count], free[count:]
    start_spares = free[:max(0, spares - len(standby))]
    return Plan(publish=due, members=tuple(w.worker_id for w in members + promoted),
                promoted=tuple(w.worker_id for w in promoted), start_members=tuple(start_members),
                start_spares=tuple(start_spares), broken=broken)


def assign_generation(placed_workers: Sequence[tuple[str, str, int]], host_order: Sequence[str],
                      previous: Mapping[str, int] | None = None) -> dict[str, RankInfo]:
    """Ranks for ``placed_workers`` (``(worker_id, host, slot)``): host by host in discovery order, then
    by slot; local and cross ranks as Horovod defines them.

    ``previous`` (worker id -> rank in the last generation) keeps the job's state where ``sync()`` takes
    it from: the host of the lowest-ranked surviving worker comes first and, on each host, surviving
    workers come before new ones, so rank 0 is always a worker that trained before (a replacement started
    in rank 0's place would otherwise hand every rank its fresh, untrained state)."""
    previous = previous or {}
    position = {host: index for index, host in enumerate(host_order)}
    survivors = sorted((previous[w[0]], w[1]) for w in placed_workers if w[0] in previous)
    if survivors:
        position[survivors[0][1]] = -1

    def order(worker: tuple[str, str, int]) -> tuple[int, str, int, int]:
        worker_id, host, slot = worker
        return position.get(host, len(position)), host, previous.get(worker_id, 1 << 30), slot

    ordered = sorted(placed_workers, key=order)
    local_index: dict[str, int] = {}
    placed = []
    for worker_id, host, _slot in ordered:
        local_index[host] = local_index.get(host, -1) + 1
        placed.append((worker_id, host, local_index[host]))
    local_sizes = {host: count + 1 for host, count in local_index.items()}
    result = {}
    for rank, (worker_id, host, local_rank) in enumerate(placed):
        peers = [h for _, h, lr in placed if lr == local_rank]
        result[worker_id] = RankInfo(rank, len(placed), local_rank, local_sizes[host], peers.index(host),
                                     len(peers), host)
    return result
