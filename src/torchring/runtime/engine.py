"""The background engine of one rank: queue → negotiate → execute → complete.

Each cycle, every rank's engine contributes the requests submitted since its last cycle to a
collective exchange on the control group. All ranks then hold the same table of pending requests
(see ``negotiation``), release the same ready responses in the same order and run them on the data
groups. Ranks may therefore submit in different orders; mismatched requests fail on every rank
with an error naming what each rank sent, and the engine carries on.

Data collectives are launched asynchronously on the data groups and finished by a ``Completer``
thread in launch order, so the engine negotiates the next requests while earlier ones are on the wire
(join, barrier and process-set changes first wait for everything launched before them).

When a cycle brings nothing new from any rank the engines go idle together and block (no CPU) until
some rank submits again or shuts down; that rank owes the others a wake-up through the store, paid only
when they do not join its next collective on their own within a fraction of a millisecond (``wakeup``).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from ..exceptions import HorovodInternalError, TensorMismatchError
from ..metrics.counters import METRICS
from ..rank_failure import note_peer_failure
from .coordination.control import ControlChannel
from .coordination.cycles import CycleExchange
from .coordination.deadlock import DeadlockWatch, Verdict
from .coordination.engine_settings import EngineSettings
from .coordination.fusion import BatchPlanner
from .coordination.launch_failures import LaunchFailure, failure_of, launch_failure_verdict, refuse_after_failed_launch
from .coordination.messages import Announcement, duplicate_message, response_backend_activity, shutdown_error
from .coordination.negotiation import Negotiator, RequestKey, Response
from .coordination.response_cache import ResponseCache
from .coordination.stall_inspector import StallInspector
from .coordination.tuning import tuning_from
from .coordination.wakeup import DeferredWake
from .cycle_start import CycleStart
from .dataplane.completion import Completer, Launched
from .dataplane.executor import Executor
from .dataplane.express import ExpressReducer
from .dataplane.process_set_table import ProcessSetTable
from .observe.flight_recorder import NULL_RECORDER, Recorder
from .observe.thread_cpu import thread_cpu_seconds
from .observe.timeline import NullTimeline, TimelineWriter
from .requests import DATA_OPS, OpType, Request

#: On a stop for everyone, how long launched collectives get to finish (one may wait for a rank that never joins).
ABORT_FLUSH_S = 2.0


class Engine(CycleStart):
    """Runs collectives for one rank in a background thread (its waiting between cycles: ``CycleStart``)."""

    def __init__(self, rank: int, size: int, control: ControlChannel, executor: Executor,
                 process_sets: ProcessSetTable, wake: DeferredWake, settings: EngineSettings,
                 report_peer_failure: Callable[[str], None] | None = None,
                 skip_name: Callable[[str, int], None] | None = None,
                 report_deadlock: Callable[[Verdict], None] | None = None) -> None:
        self.rank = rank
        self.size = size
        self._control = control
        self.executor = executor
        self._process_sets = process_sets
        #: Wakes idle peers when this rank leaves an idle epoch on its own and they do not follow (``wakeup``).
        self._wake = wake
        self._settings = settings
        self._report_peer_failure = report_peer_failure
        #: Told (name, process set) of each response this rank is a member of but has no request for (it had
        #: joined), so that its automatic names stay in step with the ranks that submitted it.
        self._skip_name = skip_name
        self._negotiator = Negotiator(size, process_sets.members)
        self._planner = BatchPlanner(settings.fusion_threshold)
        self.response_cache = ResponseCache(settings.cache_capacity, rank)
        self._queue: list[Request] = []
        self._inflight: dict[RequestKey, Request] = {}
        #: Requests whose submitter waits for the cycle that carries them (``submit``'s ``announced``).
        self._announce_watch: dict[Request, threading.Event] = {}
        #: Reduces the data of express cycles (``coordination.express``) and holds the result for ``_perform``.
        self._express = ExpressReducer(process_sets, self._inflight.get, wake.await_work)
        #: The cycle's exchange: a probe that settles the steady state, else the all-gather (``cycles``).
        self._cycles = CycleExchange(control, self._negotiator, self.response_cache, settings.control_probe,
                                     settings.control_gather_ranks,
                                     self._express.reduce if settings.control_express else None)
        self._cycle_started = 0.0
        #: True after a cycle that carried this rank's requests: the next one waits a full cycle time.
        self._pacing = False
        #: True while the engine thread waits and a submission should wake it.
        self._wants_notify = False
        #: True while the engine waits for a burst of submissions to end; ``hurry`` then sets ``_hurried``.
        self._settling = False
        self._hurried = False
        #: Set by ``probe``: an idle engine runs one cycle although nothing was submitted.
        self._probe_requested = False
        self._empty_cycles = 0
        self._everyone_blocked = False
        self._cond = threading.Condition()
        #: The condition's own lock: cheaper than ``with self._cond`` where no wait or notify follows.
        self._lock = self._cond._lock  # type: ignore[attr-defined]
        self._shutdown_requested = False
        self._woken_epoch = -1
        self._failure: BaseException | None = None
        self._stopped_by: list[int] = []
        self._stalls = StallInspector(self._negotiator, settings.stall_check_enabled and rank == 0,
                                      settings.stall_warning_s, settings.stall_shutdown_s)
        self._stall_abort = ""
        self._launch_failures: list[LaunchFailure] = []
        #: What this rank's threads are blocked on, and (rank 0) whether every rank is for good.
        self.deadlocks = DeadlockWatch(self._negotiator, settings.deadlock_confirm_s, rank == 0, report_deadlock)
        self.deadlocks.probe = self.probe
        #: Rank 0 records a Chrome-trace timeline when one is set (``HOROVOD_TIMELINE``, start_timeline()).
        self.timeline: TimelineWriter | NullTimeline = NullTimeline()
        #: Notes submitted, started and finished requests for the launcher (``TORCHRING_FLIGHT_RECORD``).
        self.recorder: Recorder = NULL_RECORDER
        #: Names the host and ranks behind the addresses in a failure's text ("" when it cannot).
        self.name_peers: Callable[[str], str] | None = None
        self._peer_names: dict[str, str] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"torchring-engine-{rank}", daemon=True)
        #: Finishes the collectives this engine launched, while the engine negotiates the next ones.
        self._completer = Completer(f"torchring-completion-{rank}", self._on_data_failure)

    # ---- called from user threads -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def discard(self) -> None:
        """End the completion thread of an engine that was never started (``init()`` built another)."""
        self._completer.close()

    @property
    def settings(self) -> EngineSettings:
        """The settings every rank's engine agreed on."""
        return self._settings

    def cpu_seconds(self) -> float:
        """CPU time the engine thread has used so far: negotiation, fusion planning, launching and
        bookkeeping (not waiting; the completion thread's averaging and copies are data work)."""
        return thread_cpu_seconds(self._thread)

    def submit(self, request: Request, announced: threading.Event | None = None) -> None:
        """Queue ``request``; raise at once for a duplicate name or a stopped engine. ``announced`` is set once
        a cycle that carried the request has completed (or the engine stopped): from then on every rank's
        request of a later cycle is negotiated after it (``join()`` orders its lanes' zeros by it)."""
        key = request.key
        with self._lock:
            self._raise_if_stopped()
            if key in self._inflight:
                raise ValueError(duplicate_message(key))
            if announced is not None:
                self._announce_watch[request] = announced
            self._inflight[key] = request
            self._queue.append(request)
            self.recorder.submitted_one(request)
            if self._wants_notify:
                self._cond.notify()

    def submit_many(self, requests: list[Request]) -> None:
        """Queue ``requests`` together (all or none), so they are negotiated in the same cycle."""
        keys = [request.key for request in requests]
        with self._cond:
            self._raise_if_stopped()
            duplicates = [key for key in keys if key in self._inflight] or [
                key for index, key in enumerate(keys) if key in keys[:index]]
            if duplicates:
                raise ValueError(duplicate_message(duplicates[0]))
            for key, request in zip(keys, requests, strict=True):
                self._inflight[key] = request
            self._queue.extend(requests)
            self.recorder.submitted(requests)
            if self._wants_notify:
                self._cond.notify()

    @property
    def inflight_count(self) -> int:
        """How many of this rank's requests are submitted and not finished."""
        return len(self._inflight)

    def hurry(self) -> None:
        """A user thread is about to block on a result: start the next cycle now instead of waiting for
        more submissions (cheap when the engine is not waiting for any)."""
        if self._queue or self._settling or self._pacing:
            with self._lock:
                self._hurried = True
                self._cond.notify()

    def probe(self) -> None:
        """A thread has waited a while on a collective (a gradient lane's allreduce, or an operation this
        engine launched): run one cycle now if the engine is idle, else let its next cycle count. A peer that
        died fails the cycle's control collective at once (its connection is gone), and the failure reaches
        that wait through ``deadlocks.aborted``; a collective whose pair to the dead peer never connected
        would otherwise wait five times Gloo's timeout. Cheap when every peer is alive: one empty cycle."""
        with self._cond:
            self._probe_requested = True
            if self._wants_notify:
                self._cond.notify()

    def shutdown(self, timeout: float) -> None:
        """Ask every rank's engine to stop after the current cycle, and wait for ours."""
        with self._cond:
            self._shutdown_requested = True
            self._cond.notify()
        self._thread.join(timeout)

    def _raise_if_stopped(self) -> None:
        if self._failure is not None:
            raise HorovodInternalError(str(self._failure)) from self._failure
        if self._stopped_by and self.rank not in self._stopped_by:
            note_peer_failure(self._report_peer_failure, f"submitted after rank {self._stopped_by} shut down")
            raise shutdown_error(self._stopped_by)
        if self._stopped.is_set() or self._shutdown_requested:
            raise HorovodInternalError(
                "torchring has been shut down; call hvd.init() again before submitting operations."
            )

    # ---- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        idle = True  # the first cycle starts with the first request (or a peer's wake-up)
        epoch = 0
        try:
            while True:
                if idle:
                    new_requests, shutting_down = self._wait_while_idle(epoch)
                    epoch += 1
                else:
                    new_requests, shutting_down = self._wait_for_cycle()
                if self._failure is not None:
                    raise self._failure
                cached, misses = self.response_cache.encode([r.meta for r in new_requests])
                announcement = Announcement(misses, shutting_down, self._stall_abort, cached,
                                            self.deadlocks.announced(), launch_failures=tuple(self._launch_failures))
                self._launch_failures.clear()
                negotiation_started = time.perf_counter()
                outcome = self._cycles.run(announcement, self.timeline)
                announcements, responses = outcome.announcements, outcome.responses
                if self._announce_watch:
                    self._tell_announced(new_requests)
                METRICS.phase("negotiation", time.perf_counter() - negotiation_started)
                failed_launch = launch_failure_verdict(announcements)
                if failed_launch:  # launched work waits for ranks that never join it: stop before launching more
                    self._abort(failed_launch, fail_first=True)
                    return
                verdict = self.deadlocks.after_cycle(announcements, responses)
                if verdict is not None and not self._stall_abort:
                    self._stall_abort = verdict.text  # the next announcement stops every rank with it
                for batch in self._planner.plan(responses):
                    if len(batch) == 1:
                        self._perform(batch[0])
                    else:
                        self._perform_fused(batch)
                if self._failure is not None:
                    raise self._failure
                self._inspect_stalls()
                abort = next((a.stall_abort for a in announcements if a.stall_abort), "")
                if abort:
                    self._abort(abort, fail_first=False)
                    return
                stopping_ranks = [r for r, a in enumerate(announcements) if a.shutting_down]
                if stopping_ranks:
                    self._completer.flush()
                    self._stopped_by = stopping_ranks
                    with self._cond:
                        operations_lost = bool(self._inflight)
                    if operations_lost and self.rank not in stopping_ranks:
                        note_peer_failure(self._report_peer_failure, f"shut down by rank {stopping_ranks}")
                    self._fail_all(shutdown_error(stopping_ranks))
                    return
                empty = not responses and not any(a.metas or a.cached for a in announcements)
                self._empty_cycles = self._empty_cycles + 1 if empty else 0
                # every rank's threads wait on requests no cycle moves (diverged, or a peer's data plane): pace all
                self._everyone_blocked = empty and all(a.blocked for a in announcements)
                idle = self._goes_idle()  # the same on every rank
        except BaseException as error:  # noqa: BLE001 - every failure must reach the waiting ranks
            self._failure = error
            # its frames' locals go (the traceback's lines stay): a failed collective's Work among them keeps
            # the group's transport open, and a peer waiting on this rank would wait for Gloo's timeout
            traceback.clear_frames(error.__traceback__)
            note_peer_failure(self._report_peer_failure, f"collective failed: {error}")
            text = self._failure_text(error)
            if not self.deadlocks.aborted:  # a step waiting in a gradient lane raises it too
                self.deadlocks.aborted = text
            if self._wake.alarm is not None:  # ranks whose collective waits on this one stop waiting
                self._wake.alarm.post(self.rank, text)
            self._fail_all(HorovodInternalError(text))
            try:
                self._wake.waker.wake(epoch)
            except Exception:  # noqa: BLE001 - the store may be gone too; nothing left to wake
                pass
        finally:
            self._completer.close()
            self._control.close()
            self._wake.waker.close()
            self.timeline.close()
            self._stopped.set()

    def _abort(self, text: str, fail_first: bool) -> None:
        """Stop with ``text`` as every rank does: after the launched collectives finish, or (``fail_first``) before."""
        if fail_first:
            self._failure = HorovodInternalError(text)
            self._fail_all(self._failure)
        self._completer.flush(ABORT_FLUSH_S)
        self.deadlocks.aborted = text  # a step waiting in a gradient lane raises it too
        self._failure = HorovodInternalError(text)
        self._fail_all(self._failure)

    def _goes_idle(self) -> bool:
        """Whether every rank's engine blocks after this cycle (decided from state all ranks share): as soon
        as nothing is left pending (a rank that submitted meanwhile wakes the others itself), or with
        ``TORCHRING_IDLE_AFTER_MS`` set, after that many cycles' worth of empty cycles."""
        if self._cycles.bits_kept:  # a rank waits for the others to announce its cached requests
            return False
        if self._settings.idle_cycles <= 1:
            return not self._negotiator.pending
        return self._empty_cycles >= self._settings.idle_cycles

    def _perform(self, response: Response) -> None:
        if self.rank not in response.members and response.members:
            return
        with self._cond:
            request = self._inflight.get(response.key)
        if request is None and self._skip_name is not None:
            self._skip_name(response.name, response.process_set)
        if response.error is not None:
            if request is not None:
                kinds = {"invalid": ValueError, "joined": HorovodInternalError}
                self._finish(request, error=kinds.get(response.error_kind, TensorMismatchError)(response.error))
            return
        op_type = response.op_type
        if op_type not in DATA_OPS:
            self._completer.flush()  # these take effect after everything launched before them
            self._perform_control(response, request)
            return
        timeline, recorder = self.timeline, self.recorder
        meta = response.template
        record = recorder.started(op_type.value, response.name)
        timeline.op_start(response.name, op_type.value)
        timeline.activity_start(response.name, response_backend_activity(response))
        try:
            refuse_after_failed_launch(self._launch_failures)
            launched = self._express.take(response.key, request) or self.executor.launch(response, request)
        except Exception as error:  # noqa: BLE001 - fail this request; the next cycle tells the others (launch_failures)
            self._launch_failures.append(failure_of(response, error))
            launched = Launched.failed(error)

        def on_done(result: object, error: BaseException | None) -> None:
            recorder.ended(record)
            timeline.activity_end(response.name)
            timeline.op_end(response.name, meta.dtype, meta.shape)
            if request is not None:
                self._finish(request, result=result, error=self._data_error(error))

        self._completer.add(launched, on_done)

    def _perform_control(self, response: Response, request: Request | None) -> None:
        """Join, barrier and process-set changes: no data moves; they complete at once."""
        op_type = response.op_type
        self.recorder.ended(self.recorder.started(op_type.value, response.name))
        result: object = None
        tuning = tuning_from(response.template)
        if tuning is not None:  # the same place in the response order on every rank, joined ones too
            self._settings = tuning.applied_to(self._settings)
            self._planner.set_threshold(tuning.fusion_threshold)
        if op_type is OpType.JOIN:
            result = response.last_joined
        elif op_type in (OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET):
            self._negotiator.recheck_all()  # requests of an added or removed set change readiness
            try:
                result = self._process_sets.change(response.template)
            except ValueError as error:
                if request is not None:
                    self._finish(request, error=error)
                return
        if request is not None:
            self._finish(request, result=result)

    def _perform_fused(self, batch: list[Response]) -> None:
        """One allreduce for several tensors (every member has a request for each of them); those an express
        cycle reduced already are finished from its results (the same on every rank)."""
        if self.rank not in batch[0].members:
            return
        held = [self._express.holds(response.key) for response in batch]
        if any(held) and not all(held):
            for response, reduced in zip(batch, held, strict=True):
                if reduced:
                    self._perform(response)
            rest = [response for response, reduced in zip(batch, held, strict=True) if not reduced]
            if len(rest) == 1:
                self._perform(rest[0])
            else:
                self._perform_fused(rest)
            return
        with self._cond:
            requests = [self._inflight[response.key] for response in batch]
        timeline, recorder = self.timeline, self.recorder
        # one record for the fused collective: it is one collective on the wire
        record = recorder.started(batch[0].op_type.value, f"{batch[0].name} (+{len(batch) - 1} fused)")
        if timeline.enabled:
            for response in batch:
                timeline.op_start(response.name, response.op_type.value)
        try:
            refuse_after_failed_launch(self._launch_failures)
            launched = (self._express.take_all([response.key for response in batch], list(requests))
                        or self.executor.launch_fused(batch, requests, timeline, response_backend_activity(batch[0])))
        except Exception as error:  # noqa: BLE001 - fail these requests; the next cycle tells the others
            self._launch_failures.extend(failure_of(response, error) for response in batch)
            launched = Launched.failed(error)

        def on_done(results: list[object] | None, error: BaseException | None) -> None:
            recorder.ended(record)
            if timeline.enabled:
                for response in batch:
                    timeline.op_end(response.name, response.template.dtype, response.template.shape)
            self._finish_many(requests, results, self._data_error(error))

        self._completer.add(launched, on_done)

    def _failure_text(self, error: BaseException, failed: str = "engine") -> str:
        """The engine's (or a collective's) failure, with the host and ranks behind any address in it
        (``name_peers``, looked up once per message)."""
        message = str(error)
        names = self._peer_names.get(message)
        if names is None:
            names = self._peer_names[message] = self.name_peers(message) if self.name_peers is not None else ""
        text = f"torchring {failed} failed on rank {self.rank}: {message}"
        return f"{text} ({names})" if names else text

    def _data_error(self, error: BaseException | None) -> BaseException | None:
        return error and HorovodInternalError(self._failure_text(error, "collective"))

    def _on_data_failure(self, error: BaseException) -> None:
        """A launched collective failed (a peer died or timed out): fail everything; the engine stops."""
        if self._failure is None:
            self._failure = error
        note_peer_failure(self._report_peer_failure, f"collective failed: {error}")
        self._fail_all(HorovodInternalError(self._failure_text(error)))
        with self._cond:
            self._cond.notify_all()

    def _finish(self, request: Request, result: object = None, error: BaseException | None = None) -> None:
        """Complete ``request`` unless it was completed already (e.g. failed by ``_fail_all``)."""
        key = request.key
        with self._lock:
            if self._inflight.get(key) is not request:
                return
            del self._inflight[key]
            self.recorder.finished(key)
        request.complete(result, error)

    def _finish_many(self, requests: list[Request], results: list[object] | None,
                     error: BaseException | None) -> None:
        """``_finish`` for each of ``requests`` (with ``results[i]``, or all with ``error``), one lock."""
        finished = []
        inflight, recorder = self._inflight, self.recorder
        with self._lock:
            for index, request in enumerate(requests):
                key = request.key
                if inflight.get(key) is request:
                    del inflight[key]
                    recorder.finished(key)
                    finished.append((request, results[index] if results is not None else None))
        for request, result in finished:
            request.complete(result, error)

    def _tell_announced(self, requests: list[Request]) -> None:
        with self._lock:
            for request in requests:
                event = self._announce_watch.pop(request, None)
                if event is not None:
                    event.set()

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            requests = list(self._inflight.values())
            self._inflight.clear()
            self._queue.clear()
            watched, self._announce_watch = self._announce_watch, {}
        for event in watched.values():
            event.set()
        for request in requests:
            self.recorder.finished(request.key)
            request.complete(error=error)

    def _inspect_stalls(self) -> None:
        self._stall_abort = self._stalls.inspect() or self._stall_abort
        if self.recorder.wants_missing:  # about once a second, for the launcher's hang report
            self.recorder.set_missing(self._stalls.missing_ranks(self.recorder.pending_keys()))
