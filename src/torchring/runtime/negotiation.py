"""The global table of pending requests, identical on every rank, and the cross-rank checks.

Every cycle each rank contributes the requests it submitted since the last cycle; all ranks receive
all contributions and apply them in rank order, so every rank computes the same table and the same
list of ready responses, in the same order, without a coordinator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..reduction import ReduceOp
from .requests import OpType, RequestMeta


@dataclass
class PendingEntry:
    """A name some ranks have submitted and others not yet."""

    metas: dict[int, RequestMeta] = field(default_factory=dict)
    first_seen: float = field(default_factory=time.monotonic)
    stall_reported_at: float = 0.0


@dataclass(frozen=True)
class Response:
    """A request every rank has submitted: run it (or, when ``error`` is set, fail it) everywhere."""

    name: str
    metas: tuple[RequestMeta, ...]
    error: str | None = None

    @property
    def op_type(self) -> OpType:
        return self.metas[0].op_type


def _describe_by_rank(values: Sequence[object]) -> str:
    """'rank 0 sent X, rank 1 sent Y' with ranks that sent the same value grouped together."""
    groups: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(str(value), []).append(rank)
    parts = []
    for value, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
        parts.append(f"{who} sent {value}")
    return "; ".join(parts)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _mismatch(what: str, name: str, values: Sequence[object]) -> str:
    return f"Mismatched {what} for tensor '{name}': {_describe_by_rank(values)}."


def check_consistency(name: str, metas: Sequence[RequestMeta]) -> str | None:
    """The error text when ranks disagree on the request named ``name``, else None."""
    checks: list[tuple[str, Callable[[RequestMeta], object]]] = [
        ("operations", lambda m: m.op_type.value),
    ]
    op_type = metas[0].op_type
    if op_type is not OpType.BARRIER:
        checks += [("data types", lambda m: m.dtype), ("devices", lambda m: m.device)]
    if op_type is OpType.ALLREDUCE:
        checks += [
            ("reduction ops", lambda m: ReduceOp(m.reduce_op).name),
            ("tensor shapes", lambda m: _shape_text(m.shape)),
            ("prescale factors", lambda m: m.prescale_factor),
            ("postscale factors", lambda m: m.postscale_factor),
        ]
    elif op_type is OpType.BROADCAST:
        checks += [
            ("root ranks", lambda m: m.root_rank),
            ("tensor shapes", lambda m: _shape_text(m.shape)),
        ]
    elif op_type is OpType.ALLGATHER:
        checks += [
            ("tensor ranks (number of dimensions)", lambda m: len(m.shape)),
            ("tensor shapes beyond the first dimension", lambda m: _shape_text(m.shape[1:])),
        ]
    for what, key in checks:
        values = [key(m) for m in metas]
        if len(set(values)) > 1:
            return _mismatch(f"{op_type.value} {what}" if what != "operations" else what, name, values)
    return None


class Negotiator:
    """Accumulates every rank's announcements and releases the requests ready on all ranks."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pending: dict[str, PendingEntry] = {}

    def record(self, rank: int, metas: Sequence[RequestMeta]) -> None:
        """Note that ``rank`` submitted ``metas``."""
        for meta in metas:
            self.pending.setdefault(meta.name, PendingEntry()).metas[rank] = meta

    def take_ready(self) -> list[Response]:
        """Remove and return the requests every rank has submitted, ordered by rank 0's submission order."""
        ready_names = [name for name, entry in self.pending.items() if len(entry.metas) == self.size]
        ready_names.sort(key=lambda name: self.pending[name].metas[0].seq)
        responses = []
        for name in ready_names:
            entry = self.pending.pop(name)
            metas = tuple(entry.metas[rank] for rank in range(self.size))
            responses.append(Response(name, metas, check_consistency(name, metas)))
        return responses

    def missing_ranks(self, entry: PendingEntry) -> list[int]:
        """Ranks that have not yet submitted ``entry``."""
        return [rank for rank in range(self.size) if rank not in entry.metas]
