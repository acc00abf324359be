"""The data side of express cycles (see ``runtime.coordination.express``): one allreduce of the predicted
request's tensor with the probe's flags appended, whose result the engine hands out as the
request's result when every rank was ready."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..coordination.express import ExpressVote, read_vote, vote_flags
from ..coordination.negotiation import RequestKey, Response
from ..requests import Request
from .completion import Launched
from .process_set_table import ProcessSetTable
from .reduce import Scaling, start_allreduce

__all__ = ["ExpressReducer"]

#: Flag tensors kept for reuse (one per combination of reduction, dtype and cache bits seen).
_FLAG_TENSORS_KEPT = 64


class ExpressReducer:
    """Runs express cycles' allreduces on the global set's CPU group and keeps a result until the engine
    releases its response. ``find_request(key)``: this rank's queued request under ``key``, if any;
    ``await_work``: how the engine waits for a cycle's collective (``wakeup.DeferredWake``)."""

    def __init__(self, process_sets: ProcessSetTable, find_request: Callable[[RequestKey], Request | None],
                 await_work: Callable[[dist.Work], None] = dist.Work.wait) -> None:
        self._process_sets = process_sets
        self._find_request = find_request
        self._await_work = await_work
        self._result: tuple[RequestKey, Request, torch.Tensor] | None = None
        self._flag_tensors: dict[tuple[int, torch.dtype, bool, int, int], torch.Tensor] = {}

    def reduce(self, response: Response, slot: int, settle: bool, mask: int, span: int) -> ExpressVote:
        """This rank's part of an express cycle carried by ``response`` in cache ``slot`` (collective): its
        tensor when ``mask`` (its cache bits) has the slot's bit, else zeros, then the probe's flags."""
        self._result = None
        meta = response.template
        request = self._find_request(response.key) if mask >> slot & 1 else None
        if mask >> slot & 1 and (request is None or request.buffer is None):
            raise RuntimeError(f"express cycle: this rank announced '{response.name}' but holds no tensor for it")
        numel = math.prod(meta.shape)
        dtype = getattr(torch, meta.dtype)
        data = request.buffer.reshape(-1) if request is not None else torch.zeros(numel, dtype=dtype)  # type: ignore[union-attr]
        buffer = torch.cat((data, self._flags(meta.reduce_op, dtype, settle, mask, span)))  # one new tensor
        size = len(response.members)
        group = self._process_sets.groups(0).for_device("cpu", size)
        launched = start_allreduce(buffer, Scaling.of(meta), group, size, scaled_numel=numel)
        if launched.work is not None:
            self._await_work(launched.work)
        vote = read_vote(meta.reduce_op, size, buffer[numel:].tolist(), span)
        if vote.settle and vote.common >> slot & 1:
            launched.finish()  # averages and postscales the tensor's part only
            self._result = (response.key, request, buffer[:numel])  # type: ignore[arg-type]
        return vote

    def _flags(self, reduce_op: int, dtype: torch.dtype, settle: bool, mask: int, span: int) -> torch.Tensor:
        """The flags tensor of ``vote_flags`` (kept: a loop sends the same flags cycle after cycle)."""
        key = (reduce_op, dtype, settle, mask, span)
        flags = self._flag_tensors.get(key)
        if flags is None:
            if len(self._flag_tensors) >= _FLAG_TENSORS_KEPT:
                self._flag_tensors.clear()
            flags = torch.tensor(vote_flags(reduce_op, settle, mask, span), dtype=dtype)
            self._flag_tensors[key] = flags
        return flags

    def take(self, key: RequestKey, request: Request | None) -> Launched | None:
        """The finished allreduce of ``request`` when an express cycle reduced it (None: launch it as usual)."""
        if self._result is None or self._result[0] != key or self._result[1] is not request or request is None:
            return None
        _, _, reduced = self._result
        self._result = None
        target = request.buffer
        assert target is not None

        def finish() -> torch.Tensor:
            target.copy_(reduced.view(target.shape))
            return target

        return Launched(None, finish)

