"""When ``DistributedOptimizer``'s buckets move from the engine to a gradient lane.

The engine negotiates every bucket by name, which checks each step across ranks but costs a control
round per cycle. Once a step went through the engine, the ranks vote (one MIN allreduce of a float,
itself negotiated): every rank that can use a lane votes yes, a rank that never can (sparse gradients,
``groups=``, an op or dtype the lane does not carry, ``TORCHRING_GRADIENT_LANE=0``) votes never, and a
joined rank counts as 0 (not now, ask again). On a unanimous yes every member opens the lane at the
same step, in the same order; on a never the optimizer stops asking. A re-initialisation makes a new
runtime, whose registry does not hold the old lane: the vote starts over.

The lane itself (``runtime.dataplane.lane``) lives in the data plane because ``join()`` and
``shutdown()`` reach it there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..collectives import allreduce
from ..process_sets import ProcessSet
from ..reduction import ReduceOp
from ..runtime import context
from ..runtime.dataplane.buckets import Bucket
from ..runtime.dataplane.lane import GradientLane, LaneSettings
from ..runtime.dataplane.lane_registry import LaneRegistry
from .bucket_reducers import ReductionSpec

__all__ = ["LANE_DTYPES", "LANE_OPS", "LaneVote"]

LANE_OPS = (ReduceOp.AVERAGE, ReduceOp.SUM)
LANE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Votes: every rank can use a lane / a rank never can (stop voting); a joined rank counts as 0.
_YES, _NEVER = 2.0, 1.0


class LaneVote:
    """One optimizer's lane: none until every rank agreed to it, then the lane of that initialisation."""

    def __init__(self, spec: ReductionSpec, buckets: Sequence[Bucket], names: Sequence[str]) -> None:
        self._spec = spec
        self._buckets = list(buckets)
        self._names = list(names)
        self._lane: GradientLane | None = None
        #: The registry of the initialisation the lane was opened in (a re-initialisation has another).
        self._registry: LaneRegistry | None = None
        self._voting = bool(self._buckets)

    @property
    def lane(self) -> GradientLane | None:
        """The open lane, unless torchring was re-initialised since it opened (then vote again)."""
        lane = self._lane
        if lane is None:
            return None
        if not context.is_initialized() or context.current().lanes is not self._registry:
            self._lane, self._voting = None, bool(self._buckets)
            return None
        return lane

    @property
    def process_set(self) -> ProcessSet:
        return self._spec.process_set

    def vote(self, possible: bool) -> None:
        """After a step negotiated by the engine: open the lane when every rank can and none has joined;
        stop asking when a rank never can. Collective over the optimizer's process set."""
        if not self._voting:
            return
        ballot = torch.tensor([_YES if possible else _NEVER])
        verdict = float(allreduce(ballot, name=f"lane_vote.{self._names[0]}", op=ReduceOp.MIN,
                                  process_set=self.process_set)[0])
        if verdict == _NEVER:
            self._voting = False
        elif verdict == _YES:
            self._open()

    def rebucket(self, buckets: Sequence[Bucket], names: Sequence[str]) -> None:
        """New buckets from the next step on; an open lane keeps its groups and takes them too. Every
        member calls it after the same step."""
        self._buckets, self._names = list(buckets), list(names)
        lane = self.lane
        if lane is not None:
            lane.rebucket(self._buckets, self._names)

    def abandon(self) -> None:
        """Forget the lane's step in flight (``load_state_dict`` after a failure)."""
        if self._lane is not None:
            self._lane.abandon()

    def _open(self) -> None:
        runtime = context.current()
        stall = runtime.engine.settings
        process_set = self.process_set
        lane_settings = LaneSettings(
            set_size=process_set.size(), set_rank=process_set.rank(),
            scaling=self._spec.scaling, compression=self._spec.compression,
            stall_warning_s=stall.stall_warning_s if stall.stall_check_enabled else 0.0,
            stall_shutdown_s=stall.stall_shutdown_s,
        )
        self._registry = runtime.lanes
        self._lane = runtime.lanes.open_lane(process_set.process_set_id, self._buckets, self._names, lane_settings)
        self._voting = False
