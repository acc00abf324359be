"""Process sets: collectives among a subset of ranks (Horovod's ``ProcessSet`` API).

Every rank creates the same process sets, either at ``init(process_sets=[...])`` or, with dynamic
process sets enabled (``init(process_sets="dynamic")`` or ``HOROVOD_DYNAMIC_PROCESS_SETS=1``),
with ``add_process_set`` called by all ranks in the same order. Collectives take ``process_set=``;
ranks outside the set do not take part.
"""

from __future__ import annotations

from collections.abc import Sequence

from .runtime import context


class ProcessSet:
    """A set of ranks (given as global ranks) that can run collectives among themselves."""

    def __init__(self, ranks: Sequence[int]) -> None:
        members = [int(r) for r in ranks]
        if len(set(members)) != len(members):
            raise ValueError(f"process set ranks must be distinct, got {members}")
        if any(r < 0 for r in members):
            raise ValueError(f"process set ranks must be non-negative, got {members}")
        self.ranks: list[int] = sorted(members)
        #: The id every rank agreed on once the set is registered; None before that.
        self.process_set_id: int | None = None

    def size(self) -> int:
        """Number of ranks in the set."""
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set, or -1 when it is not a member."""
        me = context.current().topology.rank
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        """True when this process is a member."""
        return context.current().topology.rank in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: All ranks: the default ``process_set`` of every collective (its ranks are filled in by ``init()``).
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def resolve(process_set: ProcessSet | None) -> int:
    """The id of ``process_set`` for a collective on this rank; errors for unknown or foreign sets."""
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set!r} is not registered: pass it to hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set() first")
    if not process_set.included():
        raise ValueError(f"rank {context.current().topology.rank} is not a member of {process_set!r}")
    return process_set.process_set_id


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new process set; every rank must call this, in the same order (dynamic sets only)."""
    from .runtime.requests import OpType, RequestMeta
    from .runtime.submit import submit, synchronize

    runtime = context.current()
    if not runtime.dynamic_process_sets:
        raise ValueError("process sets can only be added while running with dynamic process sets: call "
                         "hvd.init(process_sets='dynamic') or set HOROVOD_DYNAMIC_PROCESS_SETS=1")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    size = runtime.topology.size
    if not process_set.ranks or any(r >= size for r in process_set.ranks):
        raise ValueError(f"process set ranks {process_set.ranks} must be ranks of this job (size {size})")
    existing = runtime.process_sets.find(process_set.ranks)
    if existing is not None:
        raise ValueError(f"a process set with ranks {process_set.ranks} already exists (id {existing})")
    ranks = tuple(process_set.ranks)

    def meta(name: str, seq: int) -> RequestMeta:
        return RequestMeta(name=name, op_type=OpType.ADD_PROCESS_SET, splits=ranks, seq=seq)

    process_set.process_set_id = synchronize(submit(meta, "add_process_set", None, None))
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` on every rank (all must call); False for the global set or an unknown one."""
    from .runtime.requests import OpType, RequestMeta
    from .runtime.submit import submit, synchronize

    runtime = context.current()
    if not runtime.dynamic_process_sets:
        raise ValueError("process sets can only be removed while running with dynamic process sets")
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False

    def meta(name: str, seq: int) -> RequestMeta:
        return RequestMeta(name=name, op_type=OpType.REMOVE_PROCESS_SET, root_rank=set_id, seq=seq)

    removed = bool(synchronize(submit(meta, "remove_process_set", None, None)))
    if removed:
        process_set.process_set_id = None
    return removed
