"""The data side of express cycles (see ``runtime.coordination.express``): one allreduce of the carrier's
tensors with the probe's flags appended, whose parts the engine hands out as the requests' results when
every rank was ready."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..coordination.express import ExpressVote, read_vote, vote_flags
from ..coordination.negotiation import RequestKey, Response
from ..requests import Request
from .completion import Launched
from .executor import copy_all
from .process_set_table import ProcessSetTable
from .reduce import Scaling, start_allreduce

__all__ = ["ExpressReducer"]

#: Flag tensors kept for reuse (one per combination of reduction, dtype and cache bits seen).
_FLAG_TENSORS_KEPT = 64
#: How much longer, per byte of the carrier, an express cycle waits for its allreduce before it wakes idle
#: peers (``wakeup.DeferredWake``): with every rank in it, 800 KB took 1.3-3 ms at 2 ranks on 2 cores, and a
#: wake-up paid meanwhile (a store write, every rank's listener thread woken) cost the burst ~1 ms. A peer
#: that has not submitted the carrier gains nothing from being woken sooner: its cycle would miss.
_GRACE_S_PER_BYTE = 4e-9


def copy_back(parts: list[tuple[Request, torch.Tensor]]) -> list[torch.Tensor]:
    """Copy each reduced part (flat) into its request's tensor; the tensors, in order."""
    targets: list[torch.Tensor] = [request.buffer for request, _ in parts]  # type: ignore[misc]
    copy_all(targets, [reduced if target.dim() == 1 else reduced.view(target.shape)
                       for target, (_, reduced) in zip(targets, parts, strict=True)])
    return targets


class ExpressReducer:
    """Runs express cycles' allreduces on the global set's CPU group and keeps their results until the engine
    releases their responses. ``find_request(key)``: this rank's queued request under ``key``, if any;
    ``await_work``: how the engine waits for a cycle's collective (``wakeup.DeferredWake``)."""

    def __init__(self, process_sets: ProcessSetTable, find_request: Callable[[RequestKey], Request | None],
                 await_work: Callable[[dist.Work, float], None] = lambda work, longer_s: work.wait()) -> None:
        self._process_sets = process_sets
        self._find_request = find_request
        self._await_work = await_work
        #: The reduced part of each request of the last express cycle whose bit every rank set.
        self._results: dict[RequestKey, tuple[Request, torch.Tensor]] = {}
        self._flag_tensors: dict[tuple[int, torch.dtype, bool, int, int, int], torch.Tensor] = {}

    def reduce(self, responses: list[Response], slots: tuple[int, ...], settle: bool, mask: int,
               span: int, foreign: int = 0) -> ExpressVote:
        """This rank's part of an express cycle carried by ``responses`` in cache ``slots`` (collective): for
        each, its tensor when ``mask`` (its cache bits) has the slot's bit, else zeros; then the probe's flags
        (``foreign``: the slots of process sets this rank is not in, see ``vote_flags``)."""
        self._results = {}
        meta = responses[0].template
        dtype = getattr(torch, meta.dtype)
        requests = [self._find_request(response.key) if mask >> slot & 1 else None
                    for response, slot in zip(responses, slots, strict=True)]
        parts = []
        for response, slot, request in zip(responses, slots, requests, strict=True):
            if request is not None and request.buffer is not None:
                tensor = request.buffer
                parts.append(tensor if tensor.dim() == 1 else tensor.reshape(-1))
            elif mask >> slot & 1:
                raise RuntimeError(f"express cycle: this rank announced '{response.name}' but holds no tensor for it")
            else:
                parts.append(torch.zeros(math.prod(response.template.shape), dtype=dtype))
        sizes = [part.shape[0] for part in parts]
        data_numel = sum(sizes)
        buffer = torch.cat((*parts, self._flags(meta.reduce_op, dtype, settle, mask, span, foreign)))  # one new tensor
        size = len(responses[0].members)
        group = self._process_sets.groups(0).for_device("cpu", size)
        launched = start_allreduce(buffer, Scaling.of(meta), group, size, scaled_numel=data_numel)
        if launched.work is not None:
            self._await_work(launched.work, buffer.nbytes * _GRACE_S_PER_BYTE)
        vote = read_vote(meta.reduce_op, size, buffer[data_numel:].tolist(), span)
        if not vote.settle:
            return vote
        carried = sum(1 << slot for slot in slots)
        if vote.common & carried:
            launched.finish()  # averages and postscales the tensors' part only
            pieces = buffer[:data_numel].split(sizes)
            every = vote.common & carried == carried
            for response, slot, request, piece in zip(responses, slots, requests, pieces, strict=True):
                if every or vote.common >> slot & 1:
                    self._results[response.key] = (request, piece)  # type: ignore[assignment]
        return vote

    def _flags(self, reduce_op: int, dtype: torch.dtype, settle: bool, mask: int, span: int,
               foreign: int) -> torch.Tensor:
        """The flags tensor of ``vote_flags`` (kept: a loop sends the same flags cycle after cycle)."""
        key = (reduce_op, dtype, settle, mask, span, foreign)
        flags = self._flag_tensors.get(key)
        if flags is None:
            if len(self._flag_tensors) >= _FLAG_TENSORS_KEPT:
                self._flag_tensors.clear()
            flags = torch.tensor(vote_flags(reduce_op, settle, mask, span, foreign), dtype=dtype)
            self._flag_tensors[key] = flags
        return flags

    def holds(self, key: RequestKey) -> bool:
        """Whether the last express cycle reduced the request under ``key`` already."""
        return key in self._results

    def take(self, key: RequestKey, request: Request | None) -> Launched | None:
        """The finished allreduce of ``request`` when an express cycle reduced it (None: launch it as usual)."""
        taken = self.take_all([key], [request])
        return None if taken is None else Launched(None, lambda: taken.finish()[0])

    def take_all(self, keys: list[RequestKey], requests: list[Request | None]) -> Launched | None:
        """The finished allreduces of ``requests`` (their tensors, in order) when the last express cycle reduced
        every one of them; None: launch them as usual."""
        held = [self._results.get(key) for key in keys]
        if any(entry is None or entry[0] is not request or request is None
               for entry, request in zip(held, requests, strict=True)):
            return None
        for key in keys:
            del self._results[key]
        parts: list[tuple[Request, torch.Tensor]] = held  # type: ignore[assignment]
        return Launched(None, lambda: copy_back(parts))
