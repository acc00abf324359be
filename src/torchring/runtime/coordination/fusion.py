"""Tensor fusion: which ready allreduces travel together in one buffer.

Allreduces of the same process set, dtype, device, reduction op and scale factors are packed into
one buffer up to the fusion threshold (``HOROVOD_FUSION_THRESHOLD`` bytes; 0 turns fusion off) and
reduced with a single collective. The plan depends only on the negotiated responses, which every
rank holds identically, so every member forms the same batches in the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from ..devices import is_cuda
from ..requests import OpType
from .negotiation import Response

FusionKey = tuple[int, str, tuple[str, ...] | str, int, float, float]


@functools.cache
def element_size(dtype: str) -> int:
    """Bytes per element of a dtype named like ``float32``."""
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def nbytes(response: Response) -> int:
    meta = response.template
    count = 1
    for dim in meta.shape:
        count *= dim
    return count * element_size(meta.dtype)


def _fusion_key(response: Response) -> FusionKey | None:
    """The key of a response that may be fused, or None (errors, other ops, joined members)."""
    if response.error is not None or response.op_type is not OpType.ALLREDUCE:
        return None
    if len(response.metas) != len(response.members):
        return None
    meta = response.template
    # CUDA: every member's device, in rank order: a rank never packs tensors of two of its GPUs into one buffer
    devices = tuple(response.metas[r].device for r in response.members) if is_cuda(meta.device) else meta.device
    return (response.process_set, meta.dtype, devices, meta.reduce_op, meta.prescale_factor, meta.postscale_factor)


#: Tensors at least this large are reduced in place on their own: copying them into and out of a
#: fusion buffer would cost more than the latency of one more collective.
SEPARATE_AT_BYTES = 1024 * 1024


def plan_batches(responses: Sequence[Response], threshold: int,
                 separate_at: int = SEPARATE_AT_BYTES) -> list[list[Response]]:
    """Split ``responses`` into batches to run in order; a batch of several is one fused allreduce.

    Fusible responses join the open batch of their key (placed where its first member stood) while it
    stays within ``threshold`` bytes; tensors of ``separate_at`` bytes or more, and everything that
    cannot be fused, run alone, in their own place.
    """
    batches: list[list[Response]] = []
    open_batches: dict[FusionKey, tuple[list[Response], int]] = {}
    for response in responses:
        key = _fusion_key(response) if threshold > 0 else None
        size = nbytes(response) if key is not None else 0
        if key is None or size >= separate_at:
            batches.append([response])
            continue
        batch, used = open_batches.get(key, (None, 0))
        if batch is not None and used + size <= threshold:
            batch.append(response)
            open_batches[key] = (batch, used + size)
            continue
        batch = [response]
        batches.append(batch)
        open_batches[key] = (batch, size)
    return batches


class BatchPlanner:
    """``plan_batches`` that remembers its last plan: a training loop, or a burst repeated from the
    response cache, hands over the same (immutable) response objects cycle after cycle, and their plan
    is the same. Comparing the responses' identities costs far less than planning 200 of them again."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        #: (identities, the responses themselves, their plan); holding the responses keeps their
        #: identities from being reused by other objects while they are remembered.
        self._last: tuple[tuple[int, ...], list[Response], list[list[Response]]] | None = None

    def set_threshold(self, threshold: int) -> None:
        """Plan with ``threshold`` from now on (every rank changes it at the same response: ``tuning``)."""
        self.threshold = threshold
        self._last = None

    def plan(self, responses: Sequence[Response]) -> list[list[Response]]:
        """The batches of ``responses`` (do not modify them: the plan may be handed out again)."""
        if len(responses) < 2:
            return [[response] for response in responses]
        identities = tuple(map(id, responses))
        last = self._last
        if last is not None and last[0] == identities:
            return last[2]
        batches = plan_batches(responses, self.threshold)
        self._last = (identities, list(responses), batches)
        return batches
