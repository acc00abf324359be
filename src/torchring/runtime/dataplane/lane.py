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
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ...compression import Compressor
from ...exceptions import HorovodInternalError
from ...metrics.counters import METRICS
from ...rank_failure import note_peer_failure
from ..coordination.deadlock import BLOCKED_AFTER_S, LANE_SET, DeadlockWatch, call_site
from ..coordination.failure_alarm import wait_slice
from ..group_reaper import retire_on_failure
from ..observe.flight_recorder import NULL_RECORDER, OpRecord, Recorder
from ..observe.timeline import backend_activity
from .buckets import Bucket, pack_bucket, unpack_bucket
from .completion import Launched
from .data_groups import DataGroups
from .reduce import Scaling, start_allreduce
from .stall_watch import CudaStallWatch

logger = logging.getLogger("torchring")

#: Wait times travel in the carrier, possibly as float16: capped well below its largest value.
MAX_REPORTED_WAIT_MS = 60000.0


@dataclass
class LaneSettings:
    """How a lane reduces: the same on every rank (checked by the negotiation of the first step)."""

    set_size: int
    set_rank: int
    scaling: Scaling
    compression: type[Compressor]
    stall_warning_s: float
    stall_shutdown_s: float


@dataclass
class _InFlight:
    bucket: Bucket | None  # None: the flag-only carrier of a model without a shared bucket
    wire: torch.Tensor  # what travels (compressed), scaled in place by ``reduction.finish``
    ctx: Any  # what decompressing ``wire`` needs
    reduction: Launched
    name: str
    #: The flight recorder's note of this allreduce (None when recording is off).
    record: OpRecord | None = None


class GradientLane:
    """Reduces an optimizer's buckets on a process group of its own, in bucket order.

    Open one through ``LaneRegistry.open_lane``; ``cpu_time(total, copies)`` receives the CPU seconds
    each launch and unpack spends; ``recorder`` notes each allreduce for the launcher.
    """

    def __init__(self, buckets: Sequence[Bucket], names: Sequence[str], groups: DataGroups,
                 settings: LaneSettings, timeline: Callable[[], Any],
                 cpu_time: Callable[[float, float], None], recorder: Recorder = NULL_RECORDER,
                 report_peer_failure: Callable[[str], None] | None = None,
                 deadlocks: DeadlockWatch | None = None) -> None:
        self.buckets = list(buckets)
        #: Told when a step waits for its buckets a while (``deadlock``: a peer may wait in a collective).
        self._deadlocks = deadlocks
        #: Tells the launcher that a reduction failed because another rank went away (``rank_failure``).
        self._report_peer_failure = report_peer_failure
        self.names = list(names)
        #: Names the host and ranks behind the addresses in a failure's text ("" when it cannot).
        self.name_peers: Callable[[str], str] | None = None
        self._recorder = recorder
        #: What the flight recorder (the hang report, ``torchring dump``) calls each bucket's allreduce: the
        #: bucket's name, as in the timeline and in errors.
        self._labels = list(self.names)
        self._groups = groups
        self._settings = settings
        self._timeline = timeline
        self._cpu_time = cpu_time
        self._next = 0
        self._ready: set[int] = set()
        self._in_flight: list[_InFlight] = []
        self._step = 0
        #: The bucket that carries the "still training" flag; None: a one-element flag travels after the last.
        self.carrier = _carrier_of(self.buckets)
        self._shadow_buffers: dict[int, torch.Tensor] = {}
        #: How long this rank waited for the last step's first bucket (reported in the next carrier).
        self._last_wait_ms = 0.0
        #: Warns about CUDA buckets still on the wire after ``stall_warning_s`` (``stall_watch``).
        self._cuda_stalls = CudaStallWatch(settings.stall_warning_s, self._warn_stalled)

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
        and copy the reduced values back into the gradients."""
        while self._next < len(self.buckets):
            self._launch(self.buckets[self._next], flag=1.0)
            self._next += 1
        if self.carrier is None:
            self._launch_flag(1.0)
        try:
            for index, in_flight in enumerate(self._in_flight):
                waited_from = time.perf_counter()
                self._wait(in_flight, stall_checks=True)
                if index == 0:
                    self._last_wait_ms = (time.perf_counter() - waited_from) * 1000.0
                start = time.thread_time()
                self._unpack(in_flight)
                spent = time.thread_time() - start
                self._cpu_time(spent, spent)
                METRICS.phase("fusion_copy", spent)
        finally:
            self._in_flight.clear()
            self._ready.clear()
            self._next = 0
            self._step += 1

    def rebucket(self, buckets: Sequence[Bucket], names: Sequence[str]) -> None:
        """Reduce ``buckets`` from the next step on, on the same groups (the autotuner's bucket size). Every
        member calls it after the same step, between steps."""
        if self._in_flight or self._ready or self._next:
            raise RuntimeError("a gradient lane's buckets can only change between steps")
        self.buckets, self.names, self._labels = list(buckets), list(names), list(names)
        self.carrier = _carrier_of(self.buckets)
        self._shadow_buffers = {}

    def abandon(self) -> None:
        """Forget a step that will not be finished (``load_state_dict`` after a failure)."""
        for in_flight in self._in_flight:
            self._recorder.forget(in_flight.record)
        self._in_flight.clear()
        self._ready.clear()
        self._next = 0

    # ---- joined ranks ---------------------------------------------------------------------------

    def shadow_until_all_joined(self) -> int:
        """Take part with zeros in the other ranks' steps until every rank has joined; return the
        number of steps shadowed."""
        steps = 0
        while True:
            self._next = 0
            launched_before = len(self._in_flight)
            for bucket in self.buckets:
                self._launch(bucket, flag=0.0, zeros=True)
                if bucket.index == self.carrier:
                    break
            if self.carrier is None:
                self._launch_flag(0.0)
            carrier = self._in_flight[-1]
            self._wait(carrier, stall_checks=False)
            flag_index = carrier.bucket.numel if carrier.bucket is not None else 0
            if round(float(carrier.wire[flag_index])) == 0:
                for in_flight in self._in_flight[launched_before:]:
                    self._wait(in_flight, stall_checks=False)
                self._in_flight.clear()
                self._next = 0
                return steps
            for bucket in self.buckets[carrier.bucket.index + 1 if carrier.bucket is not None else len(self.buckets):]:
                self._launch(bucket, flag=0.0, zeros=True)
            for in_flight in self._in_flight:
                self._wait(in_flight, stall_checks=False)
            self._in_flight.clear()
            self._next = 0
            steps += 1

    # ---- internals ------------------------------------------------------------------------------

    def _group(self, device: torch.device) -> dist.ProcessGroup:
        group = self._groups.for_device(device.type, self._settings.set_size)
        assert group is not None
        return group

    def _pack(self, bucket: Bucket, flag: float, zeros: bool) -> torch.Tensor:
        """What the bucket reduces, unscaled (scaling happens on the wire, in ``start_allreduce``): the
        gradient itself for a bucket of one, else the gradients packed into a flat buffer; the carrier
        appends its flag and this rank's wait time."""
        params = bucket.params
        is_carrier = bucket.index == self.carrier
        if zeros:
            buffer = self._shadow_buffers.get(bucket.index)
            if buffer is None:
                numel = bucket.numel + (self._carrier_extra if is_carrier else 0)
                buffer = self._shadow_buffers[bucket.index] = params[0].new_zeros(numel)
            buffer.zero_()
            return buffer
        if not is_carrier:
            return pack_bucket(bucket)
        buffer = pack_bucket(bucket, extra=self._carrier_extra)
        numel = bucket.numel
        buffer[numel:].zero_()
        buffer[numel] = flag
        buffer[numel + 1 + self._settings.set_rank] = min(self._last_wait_ms, MAX_REPORTED_WAIT_MS)
        return buffer

    def _launch(self, bucket: Bucket, flag: float, zeros: bool = False) -> None:
        start = time.thread_time()
        buffer = self._pack(bucket, flag, zeros)
        wire, ctx = self._settings.compression.compress(buffer)
        packed = time.thread_time()
        self._start(bucket, wire, ctx, self.names[bucket.index], scaled_numel=bucket.numel)
        self._cpu_time(time.thread_time() - start, packed - start)
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
        self._start(None, buffer, None, "lane.flag", scaled_numel=0)

    def _start(self, bucket: Bucket | None, wire: torch.Tensor, ctx: Any, name: str, scaled_numel: int) -> None:
        timeline = self._timeline()
        if timeline.enabled:
            timeline.op_start(name, "ALLREDUCE")
            timeline.activity_start(name, backend_activity(wire.device.type, "allreduce"))
        label = self._labels[bucket.index] if bucket is not None else "gradient lane flag"
        record = self._recorder.started("allreduce", label, pending=True)
        reduction = start_allreduce(wire, self._settings.scaling, self._group(wire.device), self._settings.set_size,
                                    scaled_numel=scaled_numel)
        self._in_flight.append(_InFlight(bucket, wire, ctx, reduction, name, record))

    def _wait(self, in_flight: _InFlight, stall_checks: bool) -> None:
        """Wait for ``in_flight``'s allreduce, then finish it (average and postscale on the wire)."""
        started = time.perf_counter()
        try:
            self._wait_for(in_flight, stall_checks)
        finally:
            METRICS.phase("backend", time.perf_counter() - started)
        self._recorder.ended(in_flight.record)
        scaling_started = time.thread_time()
        in_flight.reduction.finish()
        spent = time.thread_time() - scaling_started
        self._cpu_time(spent, spent)
        timeline = self._timeline()
        if timeline.enabled:
            timeline.activity_end(in_flight.name)
            timeline.op_end(in_flight.name, in_flight.wire.dtype, tuple(in_flight.wire.shape))

    def _wait_for(self, in_flight: _InFlight, stall_checks: bool) -> None:
        work = in_flight.reduction.work
        assert work is not None
        warn_s = self._settings.stall_warning_s
        with retire_on_failure(work):  # the error's traceback refers to it (``group_reaper``)
            try:
                if in_flight.wire.is_cuda:
                    # CUDA: wait() orders the current stream after the collective without blocking the CPU, and
                    # a timed wait could abort the communicator; a thread of its own warns about a long one
                    work.wait()
                    if stall_checks:
                        self._cuda_stalls.watch(work, in_flight.name)
                else:  # with the stall check off (warn_s <= 0) or a joined rank's zeros: no warnings, still probes
                    self._wait_watched(work, in_flight.name, warn_s if warn_s > 0 and stall_checks else math.inf,
                                       blocks=stall_checks)
            except HorovodInternalError:
                raise
            except RuntimeError as error:
                self._note_peer_failure(f"gradient allreduce '{in_flight.name}' failed: {error}")
                names = self.name_peers(str(error)) if self.name_peers is not None else ""
                raise HorovodInternalError(
                    f"gradient allreduce '{in_flight.name}' failed: {error}{f' ({names})' if names else ''}. Another "
                    "rank probably failed or stopped; see its output."
                ) from error

    def _wait_watched(self, work: Any, name: str, warn_s: float, blocks: bool = True) -> None:
        """Wait for a CPU bucket's allreduce in slices of ``BLOCKED_AFTER_S``: after the first, tell the
        deadlock watch that this rank waits in its lane (at the script's call site; not when ``blocks`` is
        False: a joined rank's zeros wait for the others' steps), and after each one have the engine cycle
        (a peer that died fails that cycle at once, where this allreduce may wait on a pair to it that never
        connected: five times Gloo's timeout); raise the engine's failure or the engines' verdict once they
        stopped with one; warn every ``warn_s`` seconds (never when it is infinite: the stall check is off,
        or the zeros of a joined rank)."""
        started = time.monotonic()
        next_warning = warn_s
        key = (LANE_SET, f"gradient bucket '{name}'")
        watch = self._deadlocks
        blocked = False
        try:
            while True:
                if wait_slice(work, min(BLOCKED_AFTER_S, warn_s)):  # warn_s may be infinite
                    return
                if watch is not None:
                    if watch.aborted:
                        raise HorovodInternalError(watch.aborted)
                    if blocks and not blocked:
                        watch.note_blocked(key, call_site())
                    watch.probe()  # an idle engine cycles: a dead peer fails it, and ``aborted`` ends this wait
                blocked = True
                waited = time.monotonic() - started
                if waited >= next_warning:
                    self._stalled(name, waited)
                    next_warning += warn_s
        finally:
            if blocks and blocked and watch is not None:
                watch.note_unblocked(key)

    def _note_peer_failure(self, reason: str) -> None:
        """Tell the launcher that this rank's operations fail because of another rank."""
        note_peer_failure(self._report_peer_failure, reason)

    def _stalled(self, name: str, waited: float) -> None:
        shutdown_s = self._settings.stall_shutdown_s
        message = self._stall_message(name, waited)
        METRICS.stalls += 1
        if shutdown_s > 0 and waited >= shutdown_s:
            raise HorovodInternalError(f"{message} Giving up after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="
                                       f"{shutdown_s:g}.")
        logger.warning(message)

    def _warn_stalled(self, name: str, waited: float) -> None:
        """A CUDA bucket's stall (from the watch's thread): a warning; NCCL's timeout stops the job."""
        METRICS.stalls += 1
        logger.warning(self._stall_message(name, waited))

    def _stall_message(self, name: str, waited: float) -> str:
        return (f"gradient bucket '{name}' (step {self._step} of this optimizer) has waited {waited:.0f} s for "
                   "the other ranks. One of them has stopped training: it ran out of data (call hvd.join() "
                "when a rank has no more batches), is stuck, or skipped optimizer.step().")

    def _report_waits(self, name: str, waits_ms: torch.Tensor) -> None:
        timeline = self._timeline()
        if timeline.enabled and self._step > 0:
            timeline.lane_waits(name, waits_ms.tolist())

    def _unpack(self, in_flight: _InFlight) -> None:
        """Copy a reduced (already scaled) bucket back into its gradients (a training rank needs nothing
        of the carrier's flag; only its wait times, for the timeline)."""
        reduced = self._settings.compression.decompress(in_flight.wire, in_flight.ctx)
        bucket = in_flight.bucket
        if bucket is None:
            self._report_waits(in_flight.name, reduced[1:])
            return
        if bucket.index == self.carrier:
            self._report_waits(in_flight.name, reduced[bucket.numel + 1:])
        unpack_bucket(bucket, reduced)


def _carrier_of(buckets: Sequence[Bucket]) -> int | None:
    """The first bucket shared by several gradients (it carries the flag), or None."""
    return next((bucket.index for bucket in buckets if len(bucket.params) > 1), None)
