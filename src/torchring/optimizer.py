"""``DistributedOptimizer``: Horovod's optimizer wrapper, which averages gradients across ranks while
backward still runs.

Each parameter gets a hook that fires when its gradient has been accumulated
(``backward_passes_per_step`` times). Gradients travel in buckets (``runtime.dataplane.buckets``; a
``groups=`` group is a bucket of its own) and a bucket is handed to a reducer (``optim.bucket_reducers``)
as soon as all its gradients are ready, so communication overlaps the rest of backward: the engine for
the first step (negotiated and checked across ranks), then a gradient lane once the ranks have agreed
to one (``optim.lane_vote``); groups and sparse gradients are reduced gradient by gradient under the
parameters' names. ``step()`` waits for the reductions (gradients this rank did not compute count as
zeros, so no rank waits forever) and then runs the wrapped optimizer's step.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from . import settings
from .compression import Compression, Compressor
from .metrics.counters import METRICS
from .optim.adasum_optimizer import DistributedAdasumOptimizer
from .optim.autotune import Autotuner
from .optim.bucket_reducers import BucketReducer, EngineBucketReducer, PerGradientReducer, ReductionSpec
from .optim.lane_vote import LANE_DTYPES, LANE_OPS, LaneVote
from .optim.parameters import default_names, split_groups, validate_named_parameters
from .optim.sparse_gradients import SparseGradients
from .process_sets import ProcessSet, global_process_set
from .reduction import Average, ReduceOp, resolve_op
from .runtime import context
from .runtime.dataplane.buckets import Bucket, plan_buckets
from .runtime.dataplane.lane import GradientLane
from .runtime.dataplane.reduce import Scaling
from .runtime.submit import submission_batch


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed in before the wrapped optimizer's class; see ``DistributedOptimizer``."""

    def _setup_distributed(self, named_parameters: Sequence[Any] | None, compression: type[Compressor],
                           backward_passes_per_step: int, op: ReduceOp, gradient_predivide_factor: float,
                           groups: Any, sparse_as_dense: bool, process_set: ProcessSet) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        self._process_set = process_set
        if named_parameters is not None:
            self._parameter_names = validate_named_parameters(list(named_parameters), params)
        else:
            self._parameter_names = default_names(self.param_groups)
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._spec = ReductionSpec(Scaling(op, *self._scale_factors()), compression, process_set)
        self.sparse_as_dense = sparse_as_dense
        self._sparse = SparseGradients(as_dense=sparse_as_dense)
        self.backward_passes_per_step = backward_passes_per_step
        self._params = [p for p in params if p.requires_grad]
        self._allreduce_delay = {p: backward_passes_per_step for p in self._params}
        self._groups = split_groups(groups, self._params)
        cap_bytes = int(settings.read("BUCKET_CAP_MB") * 1024 * 1024)
        #: The planned flat buckets (engine, then lane) and one bucket per group (gradient by gradient).
        self._buckets = self._plan_flat_buckets(cap_bytes)
        self._group_buckets = [Bucket(index, group) for index, group in enumerate(self._groups)]
        self._group_bucket_ids = {id(b) for b in self._group_buckets}
        self._bucket_of = {p: b for b in self._buckets + self._group_buckets for p in b.params}
        self._engine_reducer = EngineBucketReducer(self._spec, self._engine_name)
        self._per_gradient = PerGradientReducer(self._spec, self._parameter_names.__getitem__, self._sparse)
        self._lane_vote = LaneVote(self._spec, self._buckets, [self._bucket_name(b) for b in self._buckets])
        #: Gradients marked ready this step, and the buckets handed to a reducer (cleared by synchronize).
        self._marked: set[torch.Tensor] = set()
        self._handed: set[int] = set()
        self._synchronized = False
        self._should_synchronize = True
        #: Steps whose gradients this rank reduced, and when the last one ended (for the flight recorder).
        self._reduced_steps = 0
        self._last_step_end: float | None = None
        #: Tunes the engine and the bucket size while training (``HOROVOD_AUTOTUNE``; ``optim.autotune``).
        self._autotuner = Autotuner.for_optimizer(self, self._params, process_set) if self._reduces() else None
        self._hook_handles = []
        if self._reduces():
            self._hook_handles = [p.register_post_accumulate_grad_hook(self._gradient_ready) for p in self._params]

    def _reduces(self) -> bool:
        """True when this rank reduces gradients with others: a member of a set of more than one rank."""
        return self._process_set.included() and self._process_set.size() > 1

    @property
    def _lane(self) -> GradientLane | None:
        """The gradient lane once every rank agreed to it, else None."""
        return self._lane_vote.lane

    # ---- hooks ----------------------------------------------------------------------------------

    def _gradient_ready(self, param: torch.Tensor) -> None:
        if param in self._marked and self._allreduce_delay[param] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                 "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._allreduce_delay[param] -= 1
        if self._allreduce_delay[param] > 0:
            return
        bucket = self._bucket_of[param]
        self._marked.add(param)
        bucket.ready.add(id(param))
        if len(bucket.ready) == len(bucket.params):
            self._hand_over(bucket)

    def _hand_over(self, bucket: Bucket) -> None:
        """Give ``bucket`` to its reducer; gradients this rank did not compute count as zeros. Planned
        buckets go to the engine or the lane; groups and buckets with sparse gradients are reduced
        gradient by gradient, the same on every rank."""
        bucket.ready.clear()
        self._handed.add(id(bucket))
        self._marked.update(bucket.params)
        for param in bucket.params:
            self._sparse.prepare(param)
        sparse = any(param.grad.is_sparse for param in bucket.params)
        grouped = id(bucket) in self._group_bucket_ids
        if sparse and not grouped and self._lane is not None:
            raise ValueError(f"parameter '{self._parameter_names[bucket.params[0]]}' got a sparse gradient after "
                             "its first steps were dense; use sparse_as_dense=True for gradients that change kind.")
        reducer = self._per_gradient if sparse or grouped else self._bucket_reducer()
        reducer.bucket_ready(bucket)

    def _plan_flat_buckets(self, cap_bytes: int) -> list[Bucket]:
        """Buckets of up to ``cap_bytes`` over the gradients that are not in a ``groups=`` group."""
        grouped = {p for group in self._groups for p in group}
        return plan_buckets([p for p in self._params if p not in grouped], cap_bytes)

    def _bucket_reducer(self) -> BucketReducer:
        """The lane once the ranks have agreed to it, else the engine."""
        lane = self._lane
        return self._engine_reducer if lane is None else lane

    def _engine_name(self, bucket: Bucket) -> str:
        """A bucket's name on the engine: its parameter's for a bucket of one, else the bucket's."""
        params = bucket.params
        return self._parameter_names[params[0]] if len(params) == 1 else self._bucket_name(bucket)

    def _bucket_name(self, bucket: Bucket) -> str:
        return f"bucket.{bucket.index}.{self._parameter_names[bucket.params[0]]}"

    def _scale_factors(self) -> tuple[float, float]:
        if self.op is ReduceOp.AVERAGE and self.gradient_predivide_factor != 1.0:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _lane_possible(self) -> bool:
        """Whether this rank can reduce its buckets on a lane (dense float gradients, Average or Sum)."""
        return (settings.read("GRADIENT_LANE") and self.op in LANE_OPS and not self._groups
                and not self._sparse.any_reduced_sparse and all(p.dtype in LANE_DTYPES for p in self._params))

    # ---- public API -----------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait until every gradient has been reduced across ranks (``step()`` calls it for you)."""
        if not self._reduces():
            self._synchronized = True
            return
        reducer = self._bucket_reducer()
        with submission_batch():
            for bucket in self._buckets + self._group_buckets:
                if id(bucket) not in self._handed:
                    self._hand_over(bucket)  # not complete on this rank: the rest contribute zeros
        waited_from = time.perf_counter()
        reducer.finish_step()
        self._per_gradient.finish_step()
        self._allreduce_delay = dict.fromkeys(self._params, self.backward_passes_per_step)
        self._marked.clear()
        self._handed.clear()
        self._sparse.restore()
        self._synchronized = True
        self._record_step(time.perf_counter() - waited_from)
        if reducer is self._engine_reducer:
            self._lane_vote.vote(self._lane_possible())

    def _record_step(self, wait_s: float) -> None:
        """Tell the flight recorder how long this step waited for its reductions and how long it took
        since the previous one ended; steps are numbered alike on every rank."""
        now = time.perf_counter()
        interval_s = None if self._last_step_end is None else now - self._last_step_end
        self._last_step_end = now
        context.current().recorder.step(self, self._reduced_steps, wait_s, interval_s)
        self._reduced_steps += 1

    @contextmanager
    def skip_synchronize(self):
        """Inside this block ``step()`` does not synchronize (use after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def set_bucket_cap(self, cap_bytes: int) -> None:
        """Reduce gradients in buckets of up to ``cap_bytes`` from the next step on (the autotuner calls it;
        ``TORCHRING_BUCKET_CAP_MB`` sets the first). Every member of the process set must call it after the
        same step, so that their buckets match."""
        if self._marked or self._handed:
            raise RuntimeError("set_bucket_cap() must be called between steps, not after backward()")
        buckets = self._plan_flat_buckets(cap_bytes)
        if [list(map(id, b.params)) for b in buckets] == [list(map(id, b.params)) for b in self._buckets]:
            return
        self._buckets = buckets
        self._bucket_of = {p: b for b in self._buckets + self._group_buckets for p in b.params}
        self._lane_vote.rebucket(self._buckets, [self._bucket_name(b) for b in self._buckets])

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before gradients are reduced."""
        if passes < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self.backward_passes_per_step = passes
        for param in self._allreduce_delay:
            self._allreduce_delay[param] = passes

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to "
                              "consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        result = super().step(closure)
        METRICS.step()
        context.note_step()
        if self._autotuner is not None:
            self._autotuner.after_step()
        return result

    def _local_step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's step, without reducing gradients."""
        return super().step(closure)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state; reductions still pending from an interrupted step are dropped."""
        self._marked.clear()
        self._handed.clear()
        for bucket in self._buckets + self._group_buckets:
            bucket.ready.clear()
        self._engine_reducer.abandon()
        self._per_gradient.abandon()
        self._lane_vote.abandon()
        self._allreduce_delay = dict.fromkeys(self._params, self.backward_passes_per_step)
        self._synchronized = False
        self._should_synchronize = True
        super().load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._marked:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                                 "cause a race condition.")
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] = Compression.none,
                         backward_passes_per_step: int = 1,
                         op: int = Average,
                         gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0,
                         groups: int | Sequence[Sequence[torch.Tensor]] | None = None,
                         sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` uses gradients averaged (``op``) over all ranks.

    The result is an instance of a subclass of the optimizer's own class, sharing its parameter groups
    and state. ``named_parameters`` (``model.named_parameters()``) names the gradients in logs and
    timelines; ``backward_passes_per_step`` accumulates locally before reducing; ``groups`` reduces
    the listed parameters together; ``gradient_predivide_factor`` splits the averaging before and after
    the sum.

    Sparse gradients are densified and allreduced with ``sparse_as_dense=True``, then made sparse again
    (the rows where the reduced gradient is not zero) before the wrapped optimizer steps. Otherwise each one is
    reduced by allgathering its indices and values (``<name>.indices``, ``<name>.values``) and the
    result replaces ``p.grad`` as a coalesced sparse tensor: the sum for ``op=Sum``, divided by
    ``size()`` for ``op=Average``; other ops raise ``ValueError``. A parameter's gradient must be
    sparse on every rank or on none.

    With ``process_set``, gradients are reduced among its members only; on other ranks the optimizer
    steps on local gradients.
    """
    resolved = resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and resolved is not ReduceOp.AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    if num_groups:
        warnings.warn("num_groups is deprecated; use groups= instead", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    mixin = DistributedAdasumOptimizer if resolved is ReduceOp.ADASUM else _DistributedOptimizer
    cls = type(optimizer.__class__.__name__, (mixin, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    if hasattr(wrapped, "_patch_step_function"):
        wrapped._patch_step_function()
    if resolved is ReduceOp.ADASUM:  # Horovod's Adasum optimizer: updates combined after the local step
        wrapped._setup_adasum(named_parameters, compression, process_set)
        return wrapped
    wrapped._setup_distributed(named_parameters, compression, backward_passes_per_step, resolved,
                               gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
