"""The process sets known to the engine: their member ranks and the groups that carry their data.

Set 0 is every rank. Others are added at ``init(process_sets=...)`` or, when dynamic process sets are
enabled, by ``add_process_set`` while running; every rank applies additions in the same order, so
ids agree everywhere. Only the members of a set create (and hold) its process groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..requests import OpType, RequestMeta
from .data_groups import DataGroups

GroupFactory = Callable[[int, tuple[int, ...], int], DataGroups]


@dataclass
class ProcessSetEntry:
    """One process set: its member ranks (global, ascending) and, on members, its groups."""

    ranks: tuple[int, ...]
    groups: DataGroups | None


class ProcessSetTable:
    """Process set ids → members and groups, for one rank."""

    def __init__(self, rank: int, size: int, global_groups: DataGroups, make_groups: GroupFactory) -> None:
        self.rank = rank
        self._make_groups = make_groups
        self._sets: dict[int, ProcessSetEntry] = {0: ProcessSetEntry(tuple(range(size)), global_groups)}
        self._next_id = 1

    def members(self, process_set: int) -> tuple[int, ...] | None:
        """The global ranks of ``process_set``, or None when it does not exist."""
        entry = self._sets.get(process_set)
        return entry.ranks if entry is not None else None

    def groups(self, process_set: int) -> DataGroups:
        entry = self._sets[process_set]
        if entry.groups is None:
            raise ValueError(f"rank {self.rank} is not a member of process set {process_set}")
        return entry.groups

    def set_rank(self, process_set: int, rank: int | None = None) -> int:
        """The index of ``rank`` (default: this rank) among the members of ``process_set``."""
        return self._sets[process_set].ranks.index(self.rank if rank is None else rank)

    def find(self, ranks: Sequence[int]) -> int | None:
        """The id of the set with exactly these ranks, if any."""
        wanted = tuple(sorted(ranks))
        return next((pid for pid, entry in self._sets.items() if entry.ranks == wanted), None)

    def add(self, ranks: Sequence[int]) -> int:
        """Register a set (every rank calls this in the same order) and return its id."""
        members = tuple(sorted(ranks))
        existing = self.find(members)
        if existing is not None:
            raise ValueError(f"a process set with ranks {list(members)} already exists (id {existing})")
        process_set = self._next_id
        self._next_id += 1
        groups = self._make_groups(process_set, members, members.index(self.rank)) if self.rank in members else None
        self._sets[process_set] = ProcessSetEntry(members, groups)
        return process_set

    def change(self, meta: RequestMeta) -> object:
        """Apply a negotiated process-set change: the added set's id, or whether the set was removed."""
        if meta.op_type is OpType.ADD_PROCESS_SET:
            return self.add(meta.splits)
        return self.remove(meta.root_rank)

    def remove(self, process_set: int) -> bool:
        """Forget a set; False for the global set or an unknown id."""
        if process_set == 0 or process_set not in self._sets:
            return False
        entry = self._sets.pop(process_set)
        if entry.groups is not None:
            entry.groups.shutdown()
        return True

    def all_groups(self) -> list[DataGroups]:
        return [entry.groups for entry in self._sets.values() if entry.groups is not None]


def release_groups_of_a_failed_start(created: list[tuple[Any, ...]], data_groups: DataGroups | None,
                                     table: ProcessSetTable | None) -> None:
    """Release, now and once each, every process group a failed ``init()`` opened: the groups it created
    (``created``, emptied), the CUDA group beside them and the process sets' groups. A group is retired once
    only: the reaper destroys a group once nothing but its one entry there refers to it."""
    holders = [holder for holder in [data_groups, *(table.all_groups() if table else [])] if holder is not None]
    made = [group for groups in created for group in groups] + [g for h in holders for g in (h.cpu, h.cuda)]
    opened = {id(group): group for group in made if group is not None}
    for holder in holders:
        holder.cpu = holder.cuda = None
    created.clear()
    for group in opened.values():
        DataGroups(group).shutdown()
