"""The steady-state path of ``DistributedOptimizer``'s gradient buckets: a lane of their own.

The first step of a ``DistributedOptimizer`` goes through the engine: every bucket is negotiated, so
the ranks have checked that their buckets match (names, shapes, dtypes, ops). The ranks then vote
once (an engine allreduce, in which a joined rank counts against). When every rank agrees, the
optimizer opens a lane: a process group of its own on which each later step's buckets are reduced
directly, in bucket order, as soon as backward has produced them, the way DDP's reducer does,
without a negotiation cycle per step. The order is the same on every rank because the buckets are.

``hvd.join()`` keeps working: one bucket of every step (the *carrier*) carries an extra element, 1 on
a rank that trains and 0 on a rank that joined. A joined rank keeps taking part in its lane's
reductions with zeros until a step in which every rank contributes 0, which all ranks see in the
same step. A rank waiting on a lane warns after ``HOROVOD_STALL_CHECK_TIME_SECONDS`` and gives up
after ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (when set), as the engine's stall inspector does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .compression import Compressor
from .exceptions import HorovodInternalError
from .gradient_buckets import Bucket
from .metrics.counters import METRICS
from .runtime.executor import DataGroups

logger = logging.getLogger("torchring")

#: Every open lane of this process, for ``join()``. Held strongly: a lane lives until torchring shuts
#: down, so that all ranks hold the same lanes whatever their garbage collectors did.
_open_lanes: list[GradientLane] = []
_registry_lock = threading.Lock()
#: CPU seconds the lanes of this process spent: [everything, of which packing/unpacking/scaling copies].
_cpu_seconds = [0.0, 0.0]
#: Wait times travel in the carrier, possibly as float16: capped well below its largest value.
MAX_REPORTED_WAIT_MS = 60000.0


def open_lanes(generation: int) -> list[GradientLane]:
    """The lanes opened during initialisation ``generation`` (for ``join()``), oldest first; lanes of
    earlier initialisations are dropped."""
    with _registry_lock:
        _open_lanes[:] = [lane for lane in _open_lanes if lane.generation >= generation]
        return [lane for lane in _open_lanes if lane.generation == generation]


def lane_cpu_seconds() -> tuple[float, float]:
    """CPU time all lanes spent so far: bookkeeping and launching, and packing, unpacking and scaling
    (the copies a DDP reducer makes too)."""
    return _cpu_seconds[0] - _cpu_seconds[1], _cpu_seconds[1]


@dataclass
class LaneSettings:
    """How a lane reduces: the same on every rank (checked by the negotiation of the first step)."""

    set_size: int
    set_rank: int
    average: bool
    prescale: float
    postscale: float
    compression: type[Compressor]
    stall_warning_s: float
    stall_shutdown_s: float


@dataclass
class _Launched:
    bucket: Bucket | None  # None: the flag-only carrier of a model without a shared bucket
    buffer: torch.Tensor  # what the gradients were packed into (or the gradient itself)
    wire: torch.Tensor  # what travels (compressed)
    ctx: Any
    work: dist.Work
    name: str


class GradientLane:
    """Reduces an optimizer's buckets on a process group of its own, in bucket order."""

    def __init__(self, buckets: Sequence[Bucket], names: Sequence[str], groups: DataGroups,
                 settings: LaneSettings, generation: int, timeline: Callable[[], Any]) -> None:
        self.buckets = list(buckets)
        self.names = list(names)
        self.generation = generation
        self._groups = groups
        self._settings = settings
        self._timeline = timeline
        self._next = 0
        self._ready: set[int] = set()
        self._launched: list[_Launched] = []
        self._step = 0
        shared = [b.index for b in self.buckets if len(b.params) > 1]
        #: The bucket that carries the "still training" flag; None: a one-element flag travels after the last.
        self.carrier: int | None = shared[0] if shared else None
        self._carrier_buffer: torch.Tensor | None = None
        self._shadow_buffers: dict[int, torch.Tensor] = {}
        #: How long this rank waited for the last step's first bucket (reported in the next carrier).
        self._last_wait_ms = 0.0
        with _registry_lock:
            _open_lanes.append(self)

    # ---- training ranks -------------------------------------------------------------------------

    def bucket_ready(self, bucket: Bucket) -> None:
        """``bucket``'s gradients are all there: launch it and every later bucket already complete."""
        self._ready.add(bucket.index)
        while self._next < len(self.buckets) and self._next in self._ready:
            self._ready.discard(self._next)
            self._launch(self.buckets[self._next], flag=1.0)
            self._next += 1

    def finish_step(self) -> None:
        """Launch the buckets not launched yet (their gradients are prepared by the caller), wait for all,
        unpack and scale."""
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next], flag=1.0)
            self._next += 1
        if self.carrier is None:
            self._launch_flag(1.0)
        try:
            for index, launched in enumerate(self._launched):
                if index == 0:
                    waited_from = time.perf_counter()
                    self._wait(launched, stall_checks=True)
                    self._last_wait_ms = (time.perf_counter() - waited_from) * 1000.0
                else:
                    self._wait(launched, stall_checks=True)
                start = time.thread_time()
                self._unpack(launched)
                spent = time.thread_time() - start
                _cpu_seconds[0] += spent
                _cpu_seconds[1] += spent
                METRICS.phase("fusion_copy", spent)
        finally:
            self._launched.clear()
            self._ready.clear()
            self._next = 0
            self._step += 1

    def abandon(self) -> None:
        """Forget a step that will not be finished (``load_state_dict`` after a failure)."""
        self._launched.clear()
        self._ready.clear()
        self._next = 0

    def close(self) -> None:
        """Stop offering this lane to ``join()`` (torchring was re-initialised)."""
        with _registry_lock:
            if self in _open_lanes:
                _open_lanes.remove(self)

    # ---- joined ranks ---------------------------------------------------------------------------

    def shadow_until_all_joined(self) -> int:
        """Take part with zeros in the other ranks' steps until every rank has joined; return the
        number of steps shadowed."""
        steps = 0
        while True:
            self._next = 0
            launched_before = len(self._launched)
            for bucket in self.buckets:
                self._launch(bucket, flag=0.0, zeros=True)
                if bucket.index == self.carrier:
                    break
            if self.carrier is None:
                self._launch_flag(0.0)
            carrier = self._launched[-1]
            self._wait(carrier, stall_checks=False)
            flag_index = carrier.bucket.numel if carrier.bucket is not None else 0
            if round(float(carrier.wire[flag_index])) == 0:
                for launched in self._launched[launched_before:]:
                    self._wait(launched, stall_checks=False)
                self._launched.clear()
                self._next = 0
                return steps
            for bucket in self.buckets[carrier.bucket.index + 1 if carrier.bucket is not None else len(self.buckets):]:
                self._launch(bucket, flag=0.0, zeros=True)
            for launched in self._launched:
                self._wait(launched, stall_checks=False)
            self._launched.clear()
            self._next = 0
            steps += 1

    # ---- internals ------------------------------------------------------------------------------

    def _group(self, device: torch.device) -> dist.ProcessGroup:
        group = self._groups.for_device(device.type, self._settings.set_size)
        assert group is not None
        return group

    def _pack(self, bucket: Bucket, flag: float, zeros: bool) -> torch.Tensor:
        params = bucket.params
        is_carrier = bucket.index == self.carrier
        if zeros:
            buffer = self._shadow_buffers.get(bucket.index)
            if buffer is None:
                numel = bucket.numel + (self._carrier_extra if is_carrier else 0)
                buffer = self._shadow_buffers[bucket.index] = params[0].new_zeros(numel)
            buffer.zero_()
            return buffer
        if len(params) == 1 and not is_carrier:
            grad = params[0].grad
            if self._settings.prescale != 1.0:
                grad.mul_(self._settings.prescale)
            return grad
        if is_carrier:
            if self._carrier_buffer is None:
                self._carrier_buffer = params[0].new_empty(bucket.numel + self._carrier_extra)
            buffer = self._carrier_buffer
        else:
            buffer = bucket.flat_buffer()
        numel = bucket.numel
        torch.cat([p.grad.reshape(-1) for p in params], out=buffer[:numel])
        if self._settings.prescale != 1.0:
            buffer[:numel].mul_(self._settings.prescale)
        if is_carrier:
            buffer[numel:].zero_()
            buffer[numel] = flag
            buffer[numel + 1 + self._settings.set_rank] = min(self._last_wait_ms, MAX_REPORTED_WAIT_MS)
        return buffer

    def _launch(self, bucket: Bucket, flag: float, zeros: bool = False) -> None:
        start = time.thread_time()
        buffer = self._pack(bucket, flag, zeros)
        wire, ctx = self._settings.compression.compress(buffer)
        packed = time.thread_time()
        self._start(bucket, buffer, wire, ctx, self.names[bucket.index])
        _cpu_seconds[0] += time.thread_time() - start
        _cpu_seconds[1] += packed - start
        METRICS.phase("fusion_copy", packed - start)

    @property
    def _carrier_extra(self) -> int:
        """Elements the carrier adds: the "still training" flag, then one wait time per rank."""
        return 1 + self._settings.set_size

    def _launch_flag(self, flag: float) -> None:
        device = self.buckets[0].params[0].device if self.buckets else torch.device("cpu")
        buffer = torch.zeros(self._carrier_extra, device=device)
        buffer[0] = flag
        if flag:
            buffer[1 + self._settings.set_rank] = min(self._last_wait_ms, MAX_REPORTED_WAIT_MS)
        self._start(None, buffer, buffer, None, "lane.flag")

    def _start(self, bucket: Bucket | None, buffer: torch.Tensor, wire: torch.Tensor, ctx: Any, name: str) -> None:
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM
        timeline = self._timeline()
        if timeline.enabled:
            timeline.op_start(name, "ALLREDUCE")
            timeline.activity_start(name, "GLOO_ALLREDUCE" if wire.device.type == "cpu" else "NCCL_ALLREDUCE")
        work = self._group(wire.device).allreduce([wire], options)
        METRICS.reduced(wire.numel() * wire.element_size())
        self._launched.append(_Launched(bucket, buffer, wire, ctx, work, name))

    def _wait(self, launched: _Launched, stall_checks: bool) -> None:
        started = time.perf_counter()
        try:
            self._wait_for(launched, stall_checks)
        finally:
            METRICS.phase("backend", time.perf_counter() - started)

    def _wait_for(self, launched: _Launched, stall_checks: bool) -> None:
        work = launched.work
        waited = 0.0
        warn_s = self._settings.stall_warning_s
        try:
            if not stall_checks or warn_s <= 0 or launched.wire.is_cuda:
                # NCCL: wait() orders the current stream after the collective without blocking the CPU, and
                # a timed wait could abort the communicator; its own watchdog reports hangs there
                work.wait()
            else:
                while True:
                    try:
                        work.wait(timedelta(seconds=warn_s))
                        break
                    except RuntimeError as error:
                        if work.is_completed() or "timed out" not in str(error).lower():
                            raise
                    waited += warn_s
                    self._stalled(launched.name, waited)
        except HorovodInternalError:
            raise
        except RuntimeError as error:
            raise HorovodInternalError(
                f"gradient allreduce '{launched.name}' failed: {error}. Another rank probably failed or "
                "stopped; see its output."
            ) from error
        timeline = self._timeline()
        if timeline.enabled:
            timeline.activity_end(launched.name)
            timeline.op_end(launched.name, launched.wire.dtype, tuple(launched.wire.shape))

    def _stalled(self, name: str, waited: float) -> None:
        shutdown_s = self._settings.stall_shutdown_s
        message = (f"gradient bucket '{name}' (step {self._step} of this optimizer) has waited {waited:.0f} s for "
                   "the other ranks. One of them has stopped training: it ran out of data (call hvd.join() "
                   "when a rank has no more batches), is stuck, or skipped optimizer.step().")
        METRICS.stalls += 1
        if shutdown_s > 0 and waited >= shutdown_s:
            raise HorovodInternalError(f"{message} Giving up after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="
                                       f"{shutdown_s:g}.")
        logger.warning(message)

    def _report_waits(self, name: str, waits_ms: torch.Tensor) -> None:
        timeline = self._timeline()
        if timeline.enabled and self._step > 0:
            timeline.lane_waits(name, waits_ms.tolist())

    def _unpack(self, launched: _Launched) -> None:
        """Copy a reduced bucket back into its gradients, scaled (a training rank needs nothing of the
        carrier's flag; only its wait times, for the timeline)."""
        reduced = self._settings.compression.decompress(launched.wire, launched.ctx)
        bucket = launched.bucket
        if bucket is None:
            self._report_waits(launched.name, reduced[1:])
            return
        scale = self._settings.postscale / (self._settings.set_size if self._settings.average else 1)
        params = bucket.params
        if bucket.index == self.carrier:
            self._report_waits(launched.name, reduced[bucket.numel + 1:])
        if len(params) == 1 and bucket.index != self.carrier:
            grad = params[0].grad
            if reduced is not grad:
                grad.copy_(reduced)
            if scale != 1.0:
                grad.mul_(scale)
            return
        offset = 0
        for param in params:
            count = param.numel()
            source = reduced[offset:offset + count].view_as(param.grad)
            if scale != 1.0:
                torch.mul(source, scale, out=param.grad)
            else:
                param.grad.copy_(source)
            offset += count


def shadow_open_lanes(generation: int) -> None:
    """For ``join()``: take part with zeros in every open lane until all ranks have joined (lanes run
    concurrently, each on its own group, since training ranks step their optimizers in any order)."""
    lanes = open_lanes(generation)
    if len(lanes) == 1:
        lanes[0].shadow_until_all_joined()
        return
    errors: list[BaseException] = []

    def shadow(lane: GradientLane) -> None:
        try:
            lane.shadow_until_all_joined()
        except BaseException as error:  # noqa: BLE001 - re-raised in the joining thread
            errors.append(error)

    threads = [threading.Thread(target=shadow, args=(lane,), name="torchring-join-lane", daemon=True)
               for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
