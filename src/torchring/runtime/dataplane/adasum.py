"""Adasum: the adaptive summation of gradients (Maleki et al., "Scaling Distributed Training with Adaptive
Summation", MLSys 2021), as Horovod's ``op=hvd.Adasum`` reduces them.

Two vectors combine as

    adasum(a, b) = (1 - a·b / (2 |a|²)) a + (1 - a·b / (2 |b|²)) b

so orthogonal gradients add up (``a + b``) and identical ones are kept once (``adasum(g, g) = g``), with
everything in between. The coefficients are computed per tensor (a fused buffer carries each tensor's
``segments``), in float64 whatever the tensor's dtype, and a zero vector leaves the other unchanged.

Ranks combine along a binary tree: with P the largest power of two not above the number of ranks N,
ranks P..N-1 first hand their vector to rank ``r - P``, which combines it with its own; then ranks
0..P-1 exchange with the partner ``r xor d`` for d = 1, 2, 4, ... (recursive doubling), both partners
computing ``adasum(lower rank's, higher rank's)``, so every rank ends with the same bits; finally rank
``r - P`` hands the result back to rank r. For a power of two this is Horovod's tree, (0,1), (2,3), then
((0,1),(2,3)); other sizes, which Horovod refuses, get the extra ranks folded in first.
``adasum_reference`` is the same tree in one process, for tests and for the curious.

The exchanges are the c10d group's own point-to-point operations (``send``/``recv``); this one
reduction rule is ours, its transport is c10d's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["adasum_allreduce", "adasum_pair", "adasum_reference"]

#: (start, end) of each tensor in a flat buffer.
Segments = Sequence[tuple[int, int]]
#: The tag of Adasum's messages (one exchange at a time per group: the engine runs them in turn).
_TAG = 0


def adasum_pair(a: torch.Tensor, b: torch.Tensor, segments: Segments | None = None) -> torch.Tensor:
    """``adasum(a, b)`` of two flat vectors, tensor by tensor over ``segments`` (default: one tensor)."""
    segments = segments or [(0, a.numel())]
    result = torch.empty_like(a)
    for start, end in segments:
        wide_a, wide_b = a[start:end].double(), b[start:end].double()
        dot = torch.dot(wide_a, wide_b)
        norm_a, norm_b = torch.dot(wide_a, wide_a), torch.dot(wide_b, wide_b)
        coefficient_a = 1 - dot / (2 * norm_a) if norm_a > 0 else torch.ones((), dtype=torch.float64)
        coefficient_b = 1 - dot / (2 * norm_b) if norm_b > 0 else torch.ones((), dtype=torch.float64)
        result[start:end] = (coefficient_a * wide_a + coefficient_b * wide_b).to(a.dtype)
    return result


def _largest_power_of_two(count: int) -> int:
    return 1 << (count.bit_length() - 1)


def adasum_reference(vectors: Sequence[torch.Tensor], segments: Segments | None = None) -> torch.Tensor:
    """The Adasum of ``vectors`` (rank order) along the tree ``adasum_allreduce`` uses, in one process."""
    values = [vector.flatten().clone() for vector in vectors]
    size = len(values)
    power = _largest_power_of_two(size)
    for rank in range(size - power):
        values[rank] = adasum_pair(values[rank], values[rank + power], segments)
    values = values[:power]
    while len(values) > 1:
        values = [adasum_pair(values[index], values[index + 1], segments) for index in range(0, len(values), 2)]
    return values[0].view_as(vectors[0])


def _exchange(mine: torch.Tensor, peer: int, group: dist.ProcessGroup, send: bool = True,
              receive: bool = True) -> torch.Tensor | None:
    """Send ``mine`` to ``peer`` (a rank of ``group``) and/or receive its vector. The lower rank sends first
    and the higher one receives first, so that a blocking transport (NCCL) never has both sides sending."""
    theirs = torch.empty_like(mine) if receive else None
    steps = []
    if send:
        steps.append(lambda: group.send([mine], peer, _TAG).wait())
    if receive:
        assert theirs is not None
        steps.append(lambda: group.recv([theirs], peer, _TAG).wait())
    for step in steps if group.rank() < peer else reversed(steps):
        step()
    return theirs


def adasum_allreduce(buffer: torch.Tensor, group: dist.ProcessGroup | None, segments: Segments | None = None
                     ) -> torch.Tensor:
    """Reduce the flat ``buffer`` of every rank of ``group`` with Adasum, in place; every rank gets the same
    result (None: a group of one rank, nothing to combine)."""
    if group is None:
        return buffer
    rank, size = group.rank(), group.size()
    power = _largest_power_of_two(size)
    value = buffer.reshape(-1)
    if rank >= power:  # an extra rank: its vector joins rank - power's, the result comes back from there
        _exchange(value, rank - power, group, receive=False)
        result = _exchange(value, rank - power, group, send=False)
        assert result is not None
        buffer.copy_(result.view_as(buffer))
        return buffer
    if rank + power < size:
        extra = _exchange(value, rank + power, group, send=False)
        assert extra is not None
        value = adasum_pair(value, extra, segments)
    distance = 1
    while distance < power:
        partner = rank ^ distance
        theirs = _exchange(value, partner, group)
        assert theirs is not None
        value = adasum_pair(value, theirs, segments) if rank < partner else adasum_pair(theirs, value, segments)
        distance <<= 1
    if rank + power < size:
        _exchange(value, rank + power, group, receive=False)
    buffer.copy_(value.view_as(buffer))
    return buffer
