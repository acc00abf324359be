"""The global table of pending requests, identical on every rank, and the cross-rank checks.

Every cycle each rank contributes the requests it submitted since the last cycle; all ranks receive
all contributions and apply them in rank order, so every rank computes the same table and the same
list of ready responses, in the same order, without a coordinator.

A request of process set S is ready once every member of S has submitted it, or has joined
(``hvd.join()``): a joined rank takes part with zeros. Requests of a group are released together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...reduction import ReduceOp
from ..devices import device_type
from ..requests import OpType, RequestMeta

RequestKey = tuple[int, str]


@dataclass
class PendingEntry:
    """A request some ranks have submitted and others not yet."""

    metas: dict[int, RequestMeta] = field(default_factory=dict)
    first_seen: float = field(default_factory=time.monotonic)
    stall_reported_at: float = 0.0


@dataclass(frozen=True)
class Response:
    """A request every member has submitted (or joined for): run it, or fail it with ``error``, everywhere."""

    name: str
    process_set: int
    members: tuple[int, ...]
    #: The metadata of each submitting rank (joined members have none).
    metas: dict[int, RequestMeta]
    error: str | None = None
    #: What the error is: "mismatch" (ranks disagree), "joined" (a joined rank cannot take part; raised as
    #: HorovodInternalError) or "invalid" (a bad request, raised as ValueError).
    error_kind: str = "mismatch"
    #: For a finished join: the last rank to join.
    last_joined: int = -1
    #: The metadata of the lowest submitting rank (the shape joined ranks take part with).
    template: RequestMeta = field(init=False)
    op_type: OpType = field(init=False)

    def __post_init__(self) -> None:
        # set once here: the engine reads them several times per request
        template = self.metas[min(self.metas)]
        object.__setattr__(self, "template", template)
        object.__setattr__(self, "op_type", template.op_type)

    @property
    def key(self) -> RequestKey:
        return (self.process_set, self.name)


def _describe_by_rank(values: Sequence[tuple[int, object]]) -> str:
    """'rank 0 sent X; rank 1 sent Y' with ranks that sent the same value grouped together."""
    groups: dict[str, list[int]] = {}
    for rank, value in values:
        groups.setdefault(str(value), []).append(rank)
    parts = []
    for value, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
        parts.append(f"{who} sent {value}")
    return "; ".join(parts)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


_REDUCTION_CHECKS: list[tuple[str, Callable[[RequestMeta], object]]] = [
    ("reduction ops", lambda m: ReduceOp(m.reduce_op).name),
    ("tensor shapes", lambda m: _shape_text(m.shape)),
    ("prescale factors", lambda m: m.prescale_factor),
    ("postscale factors", lambda m: m.postscale_factor),
]

_SHAPE_CHECKS: dict[OpType, list[tuple[str, Callable[[RequestMeta], object]]]] = {
    OpType.ALLREDUCE: _REDUCTION_CHECKS,
    OpType.REDUCESCATTER: _REDUCTION_CHECKS,
    OpType.BROADCAST: [
        ("root ranks", lambda m: m.root_rank),
        ("tensor shapes", lambda m: _shape_text(m.shape)),
    ],
    OpType.ALLGATHER: [
        ("tensor ranks (number of dimensions)", lambda m: len(m.shape)),
        ("tensor shapes beyond the first dimension", lambda m: _shape_text(m.shape[1:])),
    ],
    OpType.ALLTOALL: [
        ("tensor ranks (number of dimensions)", lambda m: len(m.shape)),
        ("tensor shapes beyond the first dimension", lambda m: _shape_text(m.shape[1:])),
    ],
    OpType.ADD_PROCESS_SET: [("process set ranks", lambda m: str(list(m.splits)))],
    OpType.REMOVE_PROCESS_SET: [("process set ids", lambda m: m.root_rank)],
}


def check_consistency(name: str, metas: dict[int, RequestMeta]) -> str | None:
    """The error text when the submitting ranks disagree on request ``name``, else None."""
    ranks = sorted(metas)
    checks: list[tuple[str, Callable[[RequestMeta], object]]] = [("operations", lambda m: m.op_type.value)]
    op_type = metas[ranks[0]].op_type
    if op_type not in (OpType.BARRIER, OpType.JOIN, OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET):
        # device types: ranks usually use different GPUs (their local rank); the indices decide fusion
        checks += [("data types", lambda m: m.dtype), ("devices", lambda m: device_type(m.device))]
    checks += _SHAPE_CHECKS.get(op_type, [])
    checks.append(("group sizes", lambda m: m.group_size))
    for what, key in checks:
        values = [(rank, key(metas[rank])) for rank in ranks]
        if len({value for _, value in values}) > 1:
            label = what if what in ("operations", "group sizes") else f"{op_type.value} {what}"
            return f"Mismatched {label} for tensor '{name}': {_describe_by_rank(values)}."
    return None


def _all_identical(metas: dict[int, RequestMeta]) -> bool:
    """True when every rank sent exactly the same request (the common case: nothing to compare)."""
    values = iter(metas.values())
    first = next(values).identity
    return all(meta.identity == first for meta in values)


class Negotiator:
    """Accumulates every rank's announcements and releases the requests ready on all members."""

    def __init__(self, size: int, members_of: Callable[[int], tuple[int, ...] | None]) -> None:
        self.size = size
        self.members_of = members_of
        self.pending: dict[RequestKey, PendingEntry] = {}
        #: Ranks that called join(), in the order they joined.
        self.joined: list[int] = []
        #: Pending requests whose readiness may have changed since the last ``take_ready``.
        self._dirty: set[RequestKey] = set()

    def record(self, rank: int, metas: Sequence[RequestMeta]) -> None:
        """Note that ``rank`` submitted ``metas``."""
        pending = self.pending
        for meta in metas:
            key = meta.key
            entry = pending.get(key)
            if entry is None:
                entry = pending[key] = PendingEntry()
            entry.metas[rank] = meta
            self._dirty.add(key)
            if meta.op_type is OpType.JOIN and rank not in self.joined:
                self.joined.append(rank)
                self.recheck_all()

    def recheck_all(self) -> None:
        """Check every pending request again (after a join or a change of process sets)."""
        self._dirty.update(self.pending)

    def take_ready(self) -> list[Response]:
        """Remove and return the ready requests, in an order every rank computes alike."""
        ready: list[Response] = []
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            entry = self.pending.get(key)
            if entry is None:
                continue
            try:
                response = self._response_if_ready(key, entry)
            except Exception as error:  # noqa: BLE001 - every rank fails the same request alike
                response = Response(key[1], key[0], tuple(sorted(entry.metas)), dict(entry.metas),
                                    f"torchring could not check request '{key[1]}': {error!r}", "invalid")
            if response is not None:
                ready.append(response)
        released = self._hold_incomplete_groups(ready)
        if len(released) != len(ready):  # members of incomplete groups: look at them again next time
            held = {r.key for r in ready} - {r.key for r in released}
            self._dirty.update(held)
        ready = released
        ready.sort(key=lambda r: (r.template.seq, min(r.metas), r.process_set, r.name))
        for response in ready:
            del self.pending[response.key]
            if response.op_type is OpType.JOIN and response.error is None:
                self.joined.clear()
                self.recheck_all()
        return ready

    def _response_if_ready(self, key: RequestKey, entry: PendingEntry) -> Response | None:
        process_set, name = key
        members = self.members_of(process_set)
        if members is None:
            return Response(name, process_set, (), dict(entry.metas),
                            f"Process set {process_set} of tensor '{name}' does not exist (removed?).", "invalid")
        if not self.joined and len(entry.metas) < len(members):
            return None  # the common case while ranks are still submitting
        submitted = set(entry.metas)
        first = entry.metas[min(submitted)]
        if first.op_type is OpType.JOIN:
            if not submitted >= set(members):
                return None
            return Response(name, process_set, members, dict(entry.metas), last_joined=self.joined[-1])
        joined = set(self.joined) & set(members)
        if not submitted | joined >= set(members):
            return None
        error = None if _all_identical(entry.metas) else check_consistency(name, entry.metas)
        kind = "mismatch"
        if error is None and joined - submitted:
            error, kind = self._joined_error(name, first, sorted(joined - submitted))
        return Response(name, process_set, members, dict(entry.metas), error, kind)

    @staticmethod
    def _joined_error(name: str, meta: RequestMeta, joined: list[int]) -> tuple[str | None, str]:
        """Joined ranks take part in allreduces (with zeros) and barriers only, as in Horovod."""
        if meta.op_type in (OpType.ALLREDUCE, OpType.BARRIER):
            return None, "mismatch"
        return (f"{meta.op_type.value} '{name}' cannot run: rank(s) {joined} already called join(); "
                "after join() a rank only takes part in allreduce."), "joined"

    def _hold_incomplete_groups(self, ready: list[Response]) -> list[Response]:
        """Keep back the ready members of a group until the whole group is ready."""
        counts: dict[tuple[int, str], int] = {}
        for response in ready:
            if response.template.group:
                group_key = (response.process_set, response.template.group)
                counts[group_key] = counts.get(group_key, 0) + 1
        return [
            r for r in ready
            if not r.template.group or counts[(r.process_set, r.template.group)] >= r.template.group_size
        ]

    def missing_ranks(self, key: RequestKey, entry: PendingEntry) -> list[int]:
        """Members that have neither submitted ``entry`` nor joined."""
        members = self.members_of(key[0]) or ()
        return [rank for rank in members if rank not in entry.metas and rank not in self.joined]

    def same_name_hint(self, key: RequestKey, missing: Sequence[int]) -> str:
        """'; rank 1 submitted broadcast.x instead' when missing ranks sent another operation of that name."""
        process_set, name = key
        _, _, user_name = name.partition(".")
        hints = []
        for (other_set, other_name), entry in self.pending.items():
            if other_set != process_set or other_name == name or other_name.partition(".")[2] != user_name:
                continue
            senders = sorted(set(entry.metas) & set(missing))
            if senders:
                who = f"rank {senders[0]}" if len(senders) == 1 else "ranks " + ",".join(map(str, senders))
                hints.append(f"{who} submitted {other_name} instead")
        return f"; {'; '.join(hints)}" if hints else ""
