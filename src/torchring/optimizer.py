"""``DistributedOptimizer``: averages gradients across ranks while backward still runs.

Each parameter gets a hook that fires when its gradient has been accumulated; the hook submits an
asynchronous in-place allreduce of that gradient, so communication overlaps the rest of backward.
A sparse gradient (``nn.Embedding(sparse=True)``) is densified first with ``sparse_as_dense=True``
and made sparse again once reduced (optimizers such as ``SparseAdam`` need it sparse); otherwise
every rank's indices and values are allgathered and summed into a sparse tensor.
``step()`` waits for the outstanding reductions (submitting zeros for parameters that got no gradient
on this rank, so no rank waits forever) and then runs the wrapped optimizer's step.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from . import settings
from .collectives import allreduce, allreduce_async_, sparse_allreduce_async
from .collectives import synchronize as wait_handle
from .compression import Compression, Compressor
from .metrics.counters import METRICS
from .optim.bucket_reducers import BucketReducer, EngineBucketReducer, ReductionSpec
from .process_sets import ProcessSet, global_process_set
from .reduction import Average, ReduceOp, resolve_op
from .runtime import context
from .runtime.dataplane.buckets import Bucket, plan_buckets
from .runtime.dataplane.lane import GradientLane, LaneSettings
from .runtime.dataplane.lane_registry import LaneRegistry
from .runtime.dataplane.reduce import Scaling
from .runtime.submit import submission_batch

_Param = torch.nn.Parameter
#: Marks a gradient that is reduced as part of its bucket's flat allreduce.
_IN_BUCKET = object()
_SPARSE_OPS = (ReduceOp.AVERAGE, ReduceOp.SUM)
_LANE_OPS = (ReduceOp.AVERAGE, ReduceOp.SUM)
_LANE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Lane votes: every rank can use a lane / a rank never can (stop voting); a joined rank counts as 0.
_LANE_YES, _LANE_NEVER = 2.0, 1.0


@dataclass(frozen=True)
class _SparseReduction:
    """The sparse allreduce of one gradient (values compressed), and what decompressing them needs."""

    handle: int
    compression_ctx: Any


def _validate_named_parameters(named_parameters: Sequence[Any], params: list[torch.Tensor]) -> dict[Any, str]:
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = [name for name, _ in named_parameters]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. "
                         f"Found duplicates: {', '.join(map(str, duplicates))}")
    named_ids = {id(param) for _, param in named_parameters}
    unnamed = [id(param) for param in params if id(param) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(map(str, unnamed))}")
    by_id = {id(param): name for name, param in named_parameters}
    return {param: str(by_id[id(param)]) for param in params}


def _split_groups(groups: int | Sequence[Sequence[torch.Tensor]] | None,
                  params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    if groups is None or groups == 0:
        return []
    if isinstance(groups, int):
        if groups < 0:
            raise ValueError("groups must be a positive number of groups or a list of parameter lists")
        per_group = -(-len(params) // groups)
        return [params[i:i + per_group] for i in range(0, len(params), per_group)]
    known = {id(p) for p in params}
    seen: set[int] = set()
    result = []
    for group in groups:
        members = []
        for param in group:
            if not isinstance(param, torch.Tensor):
                raise ValueError("groups must be a number of groups or a list of lists of parameters (tensors), "
                                 f"got a {type(param).__name__}")
            if id(param) in seen:
                raise ValueError("A parameter can only appear once in groups.")
            seen.add(id(param))
            if id(param) in known:  # tensors that are not trainable parameters here are ignored, as in Horovod
                members.append(param)
        if members:
            result.append(members)
    return result


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed in before the wrapped optimizer's class; see ``DistributedOptimizer``."""

    def _setup_distributed(self, named_parameters: Sequence[Any] | None, compression: type[Compressor],
                           backward_passes_per_step: int, op: ReduceOp, gradient_predivide_factor: float,
                           groups: Any, sparse_as_dense: bool, process_set: ProcessSet) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        self._process_set = process_set
        if named_parameters is not None:
            self._parameter_names = _validate_named_parameters(list(named_parameters), params)
        else:
            self._parameter_names = {
                p: f"allreduce.noname.{i}.{j}"
                for i, group in enumerate(self.param_groups) for j, p in enumerate(group["params"])
            }
        self._compression = compression
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._spec = ReductionSpec(Scaling(op, *self._scale_factors()), compression, process_set)
        self.sparse_as_dense = sparse_as_dense
        self.backward_passes_per_step = backward_passes_per_step
        self._params = [p for p in params if p.requires_grad]
        self._handles: dict[torch.Tensor, tuple[int | _SparseReduction | None, Any]] = {}
        self._sparse_dims: dict[torch.Tensor, int] = {}
        #: With sparse_as_dense: the sparse dimensions of the gradients seen sparse (made sparse again after
        #: their dense reduction, on either reduction path).
        self._densified_dims: dict[torch.Tensor, int] = {}
        self._allreduce_delay = {p: backward_passes_per_step for p in self._params}
        self._groups = _split_groups(groups, self._params)
        self._group_of = {p: index for index, group in enumerate(self._groups) for p in group}
        self._group_ready: dict[int, list[torch.Tensor]] = {}
        cap_bytes = int(settings.read("BUCKET_CAP_MB") * 1024 * 1024)
        self._buckets = plan_buckets([p for p in self._params if p not in self._group_of], cap_bytes)
        self._bucket_of = {p: bucket for bucket in self._buckets for p in bucket.params}
        self._engine_reducer = EngineBucketReducer(self._spec, self._engine_name)
        #: The bucket lane once every rank has agreed to it (see ``runtime.dataplane.lane``); None before.
        self._lane: GradientLane | None = None
        #: The registry of the initialisation the lane was opened in (a re-initialisation has another).
        self._lane_registry: LaneRegistry | None = None
        self._lane_voting = True
        self._synchronized = False
        self._should_synchronize = True
        #: Steps whose gradients this rank reduced, and when the last one ended (for the flight recorder).
        self._reduced_steps = 0
        self._last_step_end: float | None = None
        self._hook_handles = []
        if self._reduces():
            self._hook_handles = [p.register_post_accumulate_grad_hook(self._gradient_ready) for p in self._params]

    def _reduces(self) -> bool:
        """True when this rank reduces gradients with others: a member of a set of more than one rank."""
        return self._process_set.included() and self._process_set.size() > 1

    # ---- hooks ----------------------------------------------------------------------------------

    def _gradient_ready(self, param: torch.Tensor) -> None:
        if not self._not_submitted(param) and self._allreduce_delay[param] <= 0:
            raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                 "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
        self._allreduce_delay[param] -= 1
        if self._allreduce_delay[param] > 0:
            return
        group = self._group_of.get(param)
        if group is None:
            self._add_to_bucket(param)
            return
        ready = self._group_ready.setdefault(group, [])
        ready.append(param)
        self._handles[param] = (None, None)
        if len(ready) == len(self._groups[group]):
            self._submit_group(group)

    def _not_submitted(self, param: torch.Tensor) -> bool:
        """True when ``param``'s gradient is not yet part of a submitted reduction this step."""
        return self._handles.get(param, (None, None))[0] is None

    def _add_to_bucket(self, param: torch.Tensor) -> None:
        """Mark ``param``'s gradient ready; submit its bucket once the whole bucket is."""
        bucket = self._bucket_of[param]
        self._handles[param] = (_IN_BUCKET, None)
        bucket.ready.add(id(param))
        if len(bucket.ready) == len(bucket.params):
            self._bucket_complete(bucket)

    def _prepare_bucket(self, bucket: Bucket) -> None:
        """Zeros for the gradients this rank did not compute; dense gradients when asked."""
        bucket.ready.clear()
        for param in bucket.params:
            if param.grad is None:
                param.grad = self._zero_gradient(param)
            elif param.grad.is_sparse and self.sparse_as_dense:
                self._densify(param)
        if self._lane is not None and any(param.grad.is_sparse for param in bucket.params):
            raise ValueError(f"parameter '{self._parameter_names[bucket.params[0]]}' got a sparse gradient after "
                             "its first steps were dense; use sparse_as_dense=True for gradients that change kind.")

    def _bucket_complete(self, bucket: Bucket) -> None:
        """Hand ``bucket`` to the reducer of this step; gradients this rank did not compute count as zeros.
        Sparse gradients (only ever on the engine) are reduced one by one, the same on every rank."""
        self._prepare_bucket(bucket)
        if any(param.grad.is_sparse for param in bucket.params):
            for param in bucket.params:
                self._handles[param] = self._allreduce_gradient(param)
            return
        self._reducer().bucket_ready(bucket)

    def _reducer(self) -> BucketReducer:
        """The lane once the ranks have agreed to it, else the engine."""
        lane = self._active_lane()
        return self._engine_reducer if lane is None else lane

    def _engine_name(self, bucket: Bucket) -> str:
        """A bucket's name on the engine: its parameter's for a bucket of one, else the bucket's."""
        params = bucket.params
        return self._parameter_names[params[0]] if len(params) == 1 else self._bucket_name(bucket)

    def _scale_factors(self) -> tuple[float, float]:
        if self.op is ReduceOp.AVERAGE and self.gradient_predivide_factor != 1.0:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _submit_group(self, group: int) -> None:
        for param in self._groups[group]:
            self._handles[param] = self._allreduce_gradient(param)
        self._group_ready.pop(group, None)

    def _allreduce_gradient(self, param: torch.Tensor) -> tuple[int | _SparseReduction, Any]:
        if param.grad is None:  # another rank computed it: contribute zeros so nobody waits forever
            param.grad = self._zero_gradient(param)
        if param.grad.is_sparse:
            if not self.sparse_as_dense:
                return self._sparse_allgather(param), None
            self._densify(param)
        compressed, ctx = self._compression.compress(param.grad)
        scaling = self._spec.scaling
        handle = allreduce_async_(compressed, name=self._parameter_names[param], op=scaling.op,
                                  prescale_factor=scaling.prescale, postscale_factor=scaling.postscale,
                                  process_set=self._process_set)
        return handle, ctx

    def _densify(self, param: torch.Tensor) -> None:
        """``sparse_as_dense``: replace ``param``'s sparse gradient by its dense form for the reduction."""
        self._densified_dims[param] = param.grad.sparse_dim()
        param.grad = param.grad.to_dense()

    def _restore_sparse_gradients(self) -> None:
        """``sparse_as_dense``: make the reduced gradients of parameters seen sparse sparse again (as Horovod
        does), so that an optimizer that requires sparse gradients (``SparseAdam``) can step."""
        for param, sparse_dim in self._densified_dims.items():
            if param.grad is not None and not param.grad.is_sparse:
                param.grad = param.grad.to_sparse(sparse_dim).coalesce()

    def _zero_gradient(self, param: torch.Tensor) -> torch.Tensor:
        """Zeros for a gradient this rank did not compute, sparse if the gradient was sparse before.

        A sparse contribution keeps this rank's request names in line with ranks whose gradient is
        sparse; only parameters seen with a sparse gradient in an earlier step can be recognised.
        """
        sparse_dim = self._sparse_dims.get(param)
        if sparse_dim is None or self.sparse_as_dense:
            return torch.zeros_like(param)
        indices = torch.empty((sparse_dim, 0), dtype=torch.int64, device=param.device)
        values = param.new_empty((0, *param.shape[sparse_dim:]))
        return torch.sparse_coo_tensor(indices, values, param.shape, check_invariants=True)

    def _sparse_allgather(self, param: torch.Tensor) -> _SparseReduction:
        """Start allgathering the indices and values of ``param``'s sparse gradient from every rank."""
        name = self._parameter_names[param]
        if self.op not in _SPARSE_OPS:
            raise ValueError(f"op={self.op.name.capitalize()} is not defined for sparse gradients (parameter "
                             f"'{name}'); use op=Average or op=Sum, or sparse_as_dense=True to reduce them as "
                             "dense tensors.")
        grad = param.grad.coalesce()
        self._sparse_dims[param] = grad.sparse_dim()
        values, ctx = self._compression.compress(grad.values())
        compressed = torch.sparse_coo_tensor(grad.indices(), values, grad.shape, check_invariants=True,
                                             is_coalesced=True)
        # Summed here; averaging happens after decompression, in the gradient's own dtype.
        handle = sparse_allreduce_async(compressed, name=name, op=ReduceOp.SUM, process_set=self._process_set)
        return _SparseReduction(handle=handle, compression_ctx=ctx)

    def _sparse_result(self, reduction: _SparseReduction) -> torch.Tensor:
        """The sum (``op=Sum``) or average of all ranks' sparse gradients, as a coalesced COO tensor."""
        gathered = wait_handle(reduction.handle)  # every rank's entries, not yet coalesced
        values = self._compression.decompress(gathered._values(), reduction.compression_ctx)
        total = torch.sparse_coo_tensor(gathered._indices(), values, gathered.shape, check_invariants=True).coalesce()
        return total / self._process_set.size() if self.op is ReduceOp.AVERAGE else total

    # ---- public API -----------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait until every gradient has been reduced across ranks (``step()`` calls it for you)."""
        if not self._reduces():
            self._synchronized = True
            return
        reducer = self._reducer()
        with submission_batch():
            for bucket in self._buckets:
                if any(self._not_submitted(p) for p in bucket.params):
                    self._bucket_complete(bucket)  # not complete on this rank: the rest contribute zeros
            for param in self._params:
                if self._not_submitted(param) and param not in self._bucket_of:
                    group = self._group_of.get(param)
                    if group is not None and group in self._group_ready:
                        self._submit_group(group)
                    else:
                        self._handles[param] = self._allreduce_gradient(param)
        waited_from = time.perf_counter()
        reducer.finish_step()
        for param, (handle, ctx) in list(self._handles.items()):
            self._allreduce_delay[param] = self.backward_passes_per_step
            if handle is _IN_BUCKET:
                continue
            if isinstance(handle, _SparseReduction):
                param.grad = self._sparse_result(handle)
            else:
                output = self._compression.decompress(wait_handle(handle), ctx)
                if output is not param.grad:
                    param.grad.copy_(output)
        self._handles.clear()
        self._restore_sparse_gradients()
        self._synchronized = True
        self._record_step(time.perf_counter() - waited_from)
        if reducer is self._engine_reducer:
            self._vote_for_lane()

    def _record_step(self, wait_s: float) -> None:
        """Tell the flight recorder (``TORCHRING_OPS_FILE``) how long this step waited for its reductions
        and how long it took since the previous one ended; steps are numbered alike on every rank."""
        now = time.perf_counter()
        interval_s = None if self._last_step_end is None else now - self._last_step_end
        self._last_step_end = now
        context.current().recorder.step(self, self._reduced_steps, wait_s, interval_s)
        self._reduced_steps += 1

    # ---- the bucket lane ------------------------------------------------------------------------

    def _active_lane(self) -> GradientLane | None:
        """The lane, unless torchring was re-initialised since it opened (then vote again)."""
        lane = self._lane
        if lane is None:
            return None
        if not context.is_initialized() or context.current().lanes is not self._lane_registry:
            self._lane, self._lane_voting = None, True
            return None
        return lane

    def _lane_possible(self) -> bool:
        """Whether this rank can reduce its buckets on a lane (dense float gradients, Average or Sum)."""
        return (settings.read("GRADIENT_LANE") and self.op in _LANE_OPS and not self._groups
                and not self._sparse_dims and all(p.dtype in _LANE_DTYPES for p in self._params))

    def _vote_for_lane(self) -> None:
        """After a step negotiated by the engine: open a lane when every rank can and none has joined;
        stop asking when a rank never can."""
        if not self._lane_voting or not self._buckets:
            return
        vote = torch.tensor([_LANE_YES if self._lane_possible() else _LANE_NEVER])
        verdict = float(allreduce(vote, name=f"lane_vote.{self._bucket_name(self._buckets[0])}", op=ReduceOp.MIN,
                                  process_set=self._process_set)[0])
        if verdict == _LANE_NEVER:
            self._lane_voting = False
        elif verdict == _LANE_YES:
            runtime = context.current()
            stall = runtime.engine.settings
            lane_settings = LaneSettings(
                set_size=self._process_set.size(), set_rank=self._process_set.rank(),
                scaling=self._spec.scaling, compression=self._compression,
                stall_warning_s=stall.stall_warning_s if stall.stall_check_enabled else 0.0,
                stall_shutdown_s=stall.stall_shutdown_s,
            )
            self._lane_registry = runtime.lanes
            self._lane = runtime.lanes.open_lane(self._process_set.process_set_id, self._buckets,
                                                 [self._bucket_name(b) for b in self._buckets], lane_settings)
            self._lane_voting = False

    def _bucket_name(self, bucket: Bucket) -> str:
        return f"bucket.{bucket.index}.{self._parameter_names[bucket.params[0]]}"

    @contextmanager
    def skip_synchronize(self):
        """Inside this block ``step()`` does not synchronize (use after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

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
        return result

    def _local_step(self, closure: Any = None) -> Any:
        """The wrapped optimizer's step, without reducing gradients."""
        return super().step(closure)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state; reductions still pending from an interrupted step are dropped."""
        self._handles.clear()
        self._group_ready.clear()
        for bucket in self._buckets:
            bucket.ready.clear()
        self._engine_reducer.abandon()
        if self._lane is not None:
            self._lane.abandon()
        self._allreduce_delay = {p: self.backward_passes_per_step for p in self._params}
        self._synchronized = False
        self._should_synchronize = True
        super().load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
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
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    if hasattr(wrapped, "_patch_step_function"):
        wrapped._patch_step_function()
    wrapped._setup_distributed(named_parameters, compression, backward_passes_per_step, resolved,
                               gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
