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

from .fusion import SEPARATE_AT_BYTES

#: The first bucket of a step is small, so that its allreduce starts early in backward.
FIRST_BUCKET_BYTES = 1024 * 1024


@dataclass
class Bucket:
    """Parameters whose gradients are reduced together, and the flat buffer they share."""

    index: int
    params: list[torch.Tensor]
    ready: set[int] = field(default_factory=set)
    buffer: torch.Tensor | None = None

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def flat_buffer(self) -> torch.Tensor:
        """The bucket's reusable flat buffer (dtype and device of its parameters)."""
        if self.buffer is None:
            first = self.params[0]
            self.buffer = torch.empty(self.numel, dtype=first.dtype, device=first.device)
        return self.buffer


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


def pack_bucket(bucket: Bucket) -> torch.Tensor:
    """What ``bucket`` reduces: the gradient itself for a bucket of one, else its gradients concatenated
    into the bucket's flat buffer."""
    params = bucket.params
    if len(params) == 1:
        return params[0].grad
    flat = bucket.flat_buffer()
    torch.cat([param.grad.reshape(-1) for param in params], out=flat)
    return flat


def unpack_bucket(bucket: Bucket, reduced: torch.Tensor) -> None:
    """Copy ``reduced`` (what ``pack_bucket`` packed, after reduction) back into the bucket's gradients."""
    params = bucket.params
    if len(params) == 1 and reduced.shape == params[0].grad.shape:
        if reduced is not params[0].grad:
            params[0].grad.copy_(reduced)
        return
    offset = 0
    for param in params:
        count = param.numel()
        param.grad.copy_(reduced[offset:offset + count].view_as(param.grad))
        offset += count
