"""Static gradient buckets for ``DistributedOptimizer``: which gradients travel together.

Buckets are fixed when the optimizer is built, from the parameters in reverse order (roughly the
order backward produces their gradients), so they are the same on every rank. A gradient of
``SEPARATE_AT_BYTES`` or more gets a bucket of its own and is reduced in place; smaller ones share a
flat buffer, up to ``FIRST_BUCKET_BYTES`` for the first bucket (so that its allreduce starts early in
backward) and the bucket cap (``TORCHRING_BUCKET_CAP_MB``, 25 MB) after that. A bucket is submitted
as one allreduce once every gradient in it is ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..coordination.fusion import SEPARATE_AT_BYTES

#: The first bucket of a step is small, so that its allreduce starts early in backward.
FIRST_BUCKET_BYTES = 1024 * 1024


@dataclass
class Bucket:
    """Parameters whose gradients are reduced together, and the flat buffer they share."""

    index: int
    params: list[torch.Tensor]
    ready: set[int] = field(default_factory=set)
    buffer: torch.Tensor | None = None
    #: Each parameter's slice of ``buffer``, shaped like it: after a reduction these *are* the gradients.
    views: list[torch.Tensor] | None = None

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def flat_buffer(self, extra: int = 0) -> torch.Tensor:
        """The bucket's reusable flat buffer (dtype and device of its parameters), with ``extra`` elements
        after the gradients (the lane's carrier bookkeeping). A new size makes a new buffer."""
        wanted = self.numel + extra
        if self.buffer is None or self.buffer.numel() != wanted:
            first = self.params[0]
            self.buffer = torch.empty(wanted, dtype=first.dtype, device=first.device)
            self.views = None  # gradients that are slices of the old buffer get copied from it once
        return self.buffer

    def grads_are_views(self) -> bool:
        """Whether every gradient still is its slice of ``buffer`` (``zero_grad(set_to_none=False)`` keeps
        them, and backward then accumulates into the buffer itself)."""
        return all(self._kept_as_views())

    def _kept_as_views(self) -> list[bool]:
        """For each parameter, whether its gradient is its slice of ``buffer``."""
        views = self.views
        if views is None:
            return [False] * len(self.params)
        return [p.grad is v for p, v in zip(self.params, views, strict=True)]

    def gather_grads(self, extra: int = 0) -> torch.Tensor:
        """The gradients in ``flat_buffer(extra)``, copying only those that are not already its slices."""
        flat = self.flat_buffer(extra)
        views = self.views
        kept = self._kept_as_views()
        if not any(kept):
            torch.cat([param.grad.reshape(-1) for param in self.params], out=flat[:flat.numel() - extra])
        elif not all(kept):  # some gradients were replaced (e.g. set to None, then computed again)
            assert views is not None
            for param, view, is_view in zip(self.params, views, kept, strict=True):
                if not is_view:
                    view.copy_(param.grad)
        return flat

    def make_grads_views(self) -> bool:
        """Make each parameter's gradient its slice of ``buffer`` (which holds the reduced gradients), so
        that nothing is copied back. Only where a slice can stand for the gradient: a contiguous
        parameter of the buffer's dtype and device. Returns whether it did."""
        if self.views is None:
            buffer = self.buffer
            if buffer is None or not all(_viewable(p, buffer) for p in self.params):
                return False
            views, offset = [], 0
            for param in self.params:
                count = param.numel()
                views.append(buffer[offset:offset + count].view_as(param))
                offset += count
            self.views = views
        for param, view in zip(self.params, self.views, strict=True):
            if param.grad is not view:
                param.grad = view
        return True


def _viewable(param: torch.Tensor, buffer: torch.Tensor) -> bool:
    grad = param.grad
    return (param.is_contiguous() and param.dtype == buffer.dtype and param.device == buffer.device
            and grad is not None and not grad.is_sparse)


def plan_buckets(params: Sequence[torch.Tensor], cap_bytes: int) -> list[Bucket]:
    """Buckets over ``params`` in reverse order; parameters of different dtype or device never share one."""
    buckets: list[Bucket] = []
    current: list[torch.Tensor] = []
    current_bytes = 0

    def close() -> None:
        nonlocal current, current_bytes
        if current:
            buckets.append(Bucket(len(buckets), current))
        current, current_bytes = [], 0

    for param in reversed(list(params)):
        size = param.numel() * param.element_size()
        if size >= SEPARATE_AT_BYTES:
            close()
            buckets.append(Bucket(len(buckets), [param]))
            continue
        if current and (current[0].dtype != param.dtype or current[0].device != param.device):
            close()
        current.append(param)
        current_bytes += size
        if current_bytes >= (FIRST_BUCKET_BYTES if not buckets else cap_bytes):
            close()
    close()
    return buckets


def pack_bucket(bucket: Bucket, extra: int = 0) -> torch.Tensor:
    """What ``bucket`` reduces: the gradient itself for a bucket of one (and no ``extra``), else its
    gradients concatenated into the bucket's flat buffer, followed by ``extra`` elements the caller
    fills. Gradients that already are the buffer's slices (see ``Bucket.make_grads_views``) are not
    copied."""
    params = bucket.params
    if len(params) == 1 and not extra:
        return params[0].grad
    return bucket.gather_grads(extra)


def unpack_bucket(bucket: Bucket, reduced: torch.Tensor) -> None:
    """Put ``reduced`` (what ``pack_bucket`` packed, after reduction) into the bucket's gradients: the
    bucket's own buffer becomes them (its slices), anything else (a decompressed copy) is copied in."""
    params = bucket.params
    if len(params) == 1 and reduced.shape == params[0].grad.shape:
        if reduced is not params[0].grad:
            params[0].grad.copy_(reduced)
        return
    if reduced is bucket.buffer and bucket.make_grads_views():
        return
    offset = 0
    for param in params:
        count = param.numel()
        param.grad.copy_(reduced[offset:offset + count].view_as(param.grad))
        offset += count
