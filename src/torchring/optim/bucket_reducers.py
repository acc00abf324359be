"""How ``DistributedOptimizer`` reduces its gradient buckets: one interface, two implementations.

``EngineBucketReducer`` submits each bucket to the engine as a named allreduce, so it is negotiated
and checked across ranks (the first step, and every step where a lane is not possible).
``GradientLane`` (``runtime.dataplane.lane``) reduces them on a group of its own once the ranks have
agreed to it. Both compress with the optimizer's compressor and scale through the same
``runtime.dataplane.reduce.start_allreduce``, so a step gives bitwise the same gradients on either path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..collectives import allreduce_async_
from ..collectives import synchronize as wait_handle
from ..compression import Compressor
from ..process_sets import ProcessSet
from ..runtime.dataplane.buckets import Bucket, pack_bucket, unpack_bucket
from ..runtime.dataplane.reduce import Scaling


class BucketReducer(Protocol):
    """Reduces the buckets of one optimizer step across ranks and writes the results into the gradients."""

    def bucket_ready(self, bucket: Bucket) -> None:
        """Every gradient of ``bucket`` is in place (zeros where this rank computed none): start it."""

    def finish_step(self) -> None:
        """Start the buckets not started yet (their gradients are in place), wait for all, write back."""

    def abandon(self) -> None:
        """Forget a step that will not be finished."""


@dataclass(frozen=True)
class ReductionSpec:
    """What an optimizer's reduction is: the same for every bucket and on every path."""

    scaling: Scaling
    compression: type[Compressor]
    process_set: ProcessSet


class EngineBucketReducer:
    """Each bucket is one negotiated in-place allreduce through the engine (fused with others there)."""

    def __init__(self, spec: ReductionSpec, name_of: Callable[[Bucket], str]) -> None:
        self._spec = spec
        self._name_of = name_of
        self._pending: dict[int, tuple[Bucket, int, Any]] = {}

    def bucket_ready(self, bucket: Bucket) -> None:
        compressed, ctx = self._spec.compression.compress(pack_bucket(bucket))
        scaling = self._spec.scaling
        handle = allreduce_async_(compressed, name=self._name_of(bucket), op=scaling.op,
                                  prescale_factor=scaling.prescale, postscale_factor=scaling.postscale,
                                  process_set=self._spec.process_set)
        self._pending[bucket.index] = (bucket, handle, ctx)

    def finish_step(self) -> None:
        """Wait for the submitted buckets (the optimizer submits the rest first) and write them back."""
        try:
            for bucket, handle, ctx in self._pending.values():
                unpack_bucket(bucket, self._spec.compression.decompress(wait_handle(handle), ctx))
        finally:
            self._pending.clear()

    def abandon(self) -> None:
        self._pending.clear()
