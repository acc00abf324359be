"""``init``/``shutdown``: the process groups, the engine and the topology of one initialisation."""

from __future__ import annotations

import atexit
import functools
import logging
import math
import socket
import sys
import threading
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from ..contract import (
    elastic_first_step_key,
    elastic_generation_prefix,
    generation_prefix,
)
from ..environments import (
    ClusterEnvironment,
    ElasticLauncherEnvironment,
    Rendezvous,
    detect_environment,
)
from ..exceptions import NOT_INITIALIZED_MESSAGE
from ..metrics.counters import METRICS
from ..settings import Settings
from ..store_auth import AuthenticatedStore, job_credentials
from . import wake_probe
from .assembly import RuntimeParts, data_groups_for, deadlock_reporter, peer_failure_reporter
from .coordination.engine_settings import EngineSettings
from .coordination.failure_alarm import FailureAlarm
from .coordination.topology import Topology
from .coordination.wakeup import DeferredWake, LocalWaker, StoreWaker, Waker
from .dataplane.data_groups import DataGroups
from .dataplane.executor import Executor
from .dataplane.lane_registry import GroupOpener, LaneRegistry
from .dataplane.process_set_table import ProcessSetTable
from .engine import Engine
from .group_reaper import settle
from .meeting import meet
from .names import skip_auto_name
from .observe.flight_recorder import NULL_RECORDER, Recorder, open_recorder
from .observe.timeline import NullTimeline, TimelineWriter
from .peer_names import name_addresses
from .startup import (
    StepClock,
    freeze_long_lived_objects,
    lazy_connection_available,
    one_start_up,
    store_client,
)

logger = logging.getLogger("torchring")
#: How long ``shutdown()`` waits for the reaper to destroy the groups (milliseconds in a healthy job).
SETTLE_S = 1.0


@dataclass
class Runtime:
    """Everything one ``init()`` created; dropped by ``shutdown()``."""

    environment: ClusterEnvironment
    topology: Topology
    store: dist.Store
    #: The same store's signed view (``store_auth``): torchring's own values between processes.
    signed: AuthenticatedStore
    control_group: dist.ProcessGroup | None
    process_sets: ProcessSetTable
    engine: Engine
    generation: int
    dynamic_process_sets: bool
    #: The settings parsed at this ``init()``.
    settings: Settings
    #: ``DistributedOptimizer``'s gradient lanes and their groups (see ``runtime.dataplane.lane_registry``).
    lanes: LaneRegistry
    #: Publishes this rank's metrics to the launcher (``torchring run --metrics-port``), if asked.
    metrics_publisher: object | None = None
    #: Writes this rank's last collectives and step times for the launcher (``TORCHRING_FLIGHT_RECORD``).
    recorder: Recorder = NULL_RECORDER
    #: Rank 0 of an elastic generation: the key that tells the launcher its first step completed (cleared
    #: once set); None elsewhere.
    first_step_key: str | None = None
    #: Seconds this rank's ``init()`` spent in each step (``startup.StepClock``: store, rendezvous, groups, ...).
    init_seconds: dict[str, float] = field(default_factory=dict)
    #: ``join()`` calls that returned (every rank joined): the same on every rank, which step counts may not be.
    joins: int = 0
    #: Seconds a blocking wait polls for its result before it sleeps (``wait_spin_seconds``; None: as
    #: ``wake_probe.auto_spin_seconds`` says).
    wait_spin_s: float | None = 0.0


_lock = threading.RLock()
_runtime: Runtime | None = None
_generation = 0
_served_stores: dict[tuple[str, int], dist.Store] = {}
_atexit_registered = False


def start_timeout(settings: Settings) -> timedelta:
    """How long rendezvous waits for every rank (``TORCHRING_START_TIMEOUT``, default 300 s)."""
    return timedelta(seconds=settings.start_timeout)


def collective_timeout(settings: Settings) -> timedelta:
    """How long one collective may wait for a peer (``HOROVOD_GLOO_TIMEOUT_SECONDS``, default 30 s)."""
    return timedelta(seconds=settings.gloo_timeout_seconds)


def _open_store(rendezvous: Rendezvous, timeout: timedelta) -> dist.Store:
    """The rendezvous store (served here when this rank serves it), and every other client of it this
    process will use, opened now (``startup``: once per process, before the ranks synchronise)."""
    if rendezvous.host is None:
        return dist.HashStore()
    assert rendezvous.port is not None
    key = (rendezvous.host, rendezvous.port)
    if rendezvous.serve_store and key not in _served_stores and not _served_by_default_group(rendezvous):
        # kept for the process: a re-init must not rebind the port
        _served_stores[key] = dist.TCPStore(
            rendezvous.host, rendezvous.port, is_master=True, timeout=timeout, wait_for_workers=False
        )
    if key in _served_stores:
        StoreWaker.connect(rendezvous.host, rendezvous.port, timeout)
        return _served_stores[key]
    try:
        store = store_client(rendezvous.host, rendezvous.port, timeout)
        StoreWaker.connect(rendezvous.host, rendezvous.port, timeout)
        return store
    except Exception as error:
        raise RuntimeError(
            f"torchring could not reach the rendezvous store at {rendezvous.host}:{rendezvous.port}: {error}. "
            "Check that the launcher (or rank 0) is running and that this address is reachable."
        ) from error


def _served_by_default_group(rendezvous: Rendezvous) -> bool:
    """Whether this process's own default process group already serves the rendezvous port: a script (or
    Ray Train, Lightning, Accelerate) called ``init_process_group()`` with the same ``MASTER_ADDR`` and
    ``MASTER_PORT`` before ``hvd.init()``. Rank 0 then joins that store as a client instead of failing to
    listen on a port it holds itself; torchring's keys live under prefixes of their own there."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    assert rendezvous.host is not None and rendezvous.port is not None
    try:
        socket.create_connection((rendezvous.host, rendezvous.port), timeout=2.0).close()
    except OSError:  # nobody serves that port (the default group met elsewhere, e.g. file://): serve it here
        return False
    logger.debug("torchring: the default process group serves %s:%d already; joining its store",
                 rendezvous.host, rendezvous.port)
    return True


def _initial_timeline(rank: int, settings: Settings) -> TimelineWriter | None:
    """Rank 0's timeline when ``HOROVOD_TIMELINE`` names a file (``DYNAMIC``: none until start_timeline())."""
    path = settings.timeline
    if rank != 0 or path is None or path.upper() == "DYNAMIC":
        return None
    return TimelineWriter(path, mark_cycles=settings.timeline_mark_cycles)


def _apply_gil_switch_interval(settings: Settings) -> None:
    """``sys.setswitchinterval`` from ``TORCHRING_GIL_SWITCH_INTERVAL_MS`` when it is set; unset, the
    program's own interval (Python's default is 5 ms) stands.

    A shorter interval lets the engine thread take the interpreter lock sooner from a training thread
    that runs Python code, but every forced hand-over costs the thread that submits: with 0.5 ms a
    burst of 200 small ``allreduce_async_`` calls took 30-40% longer on 2 cores, while training
    throughput did not change (docs/tuning.md has the measurements).
    """
    if (given := settings.gil_switch_interval_ms) is not None and given > 0:
        sys.setswitchinterval(given / 1000.0)


def _shared_engine_values(settings: Settings) -> tuple[int, ...]:
    """This rank's values of the engine knobs every rank must share (rank 0's apply)."""
    cycle_time_s = settings.cycle_time / 1000.0
    idle_after_s = settings.idle_after_ms / 1000.0
    idle_cycles = max(1, min(1000, math.ceil(idle_after_s / max(cycle_time_s, 1e-6))))
    return (settings.fusion_threshold, settings.cache_capacity, idle_cycles, int(settings.control_probe),
            settings.control_gather_ranks, int(settings.control_express))


def _engine_settings(everyone: list[tuple], rank: int, settings: Settings) -> EngineSettings:
    """The engine's knobs; those every rank must share (fusion threshold, cache capacity, cycles before
    idling, the steady-state probe, the gathered exchange, express cycles) are rank 0's, from ``everyone``'s
    ``_shared_engine_values``."""
    fusion_threshold, cache_capacity, idle_cycles, control_probe, control_gather_ranks, express = everyone[0]
    if rank == 0 and any(values[:2] != everyone[0][:2] for values in everyone):
        logger.warning("ranks set different HOROVOD_FUSION_THRESHOLD/HOROVOD_CACHE_CAPACITY values %s; "
                       "every rank uses rank 0's (%d, %d)", [v[:2] for v in everyone], fusion_threshold,
                       cache_capacity)
    return EngineSettings(
        cycle_time_s=settings.cycle_time / 1000.0,
        stall_check_enabled=not settings.stall_check_disable,
        stall_warning_s=settings.stall_check_time_seconds,
        stall_shutdown_s=settings.stall_shutdown_time_seconds,
        fusion_threshold=fusion_threshold,
        cache_capacity=cache_capacity,
        idle_cycles=idle_cycles,
        deadlock_confirm_s=settings.deadlock_timeout,
        control_probe=bool(control_probe),
        control_gather_ranks=control_gather_ranks,
        control_express=bool(express),
    )


def init(process_sets: list[tuple[int, ...]] | None = None, dynamic_process_sets: bool = False,
         settings: Settings | None = None) -> list[int]:
    """Join the job: discover ranks, rendezvous, create the process groups and start the engine.

    ``process_sets`` lists the member ranks of extra process sets every rank creates now; their ids
    are returned in order. ``settings`` defaults to ``Settings.from_env()``. Calling it again while
    initialised does nothing; after ``shutdown()`` it starts a fresh rendezvous.
    """
    global _runtime, _generation, _atexit_registered
    with _lock, one_start_up():
        if _runtime is not None:
            return []
        settings = Settings.from_env() if settings is None else settings
        if settings.log_level is not None:
            logger.setLevel(settings.log_level)
        freeze_long_lived_objects(settings.gc_freeze)
        _apply_gil_switch_interval(settings)
        clock = StepClock()
        rendezvous_timeout, timeout = start_timeout(settings), collective_timeout(settings)
        environment = detect_environment()
        environment.prepare()
        credentials = job_credentials()  # takes the job's secret out of the environment
        _generation += 1
        first_step_key = None
        if isinstance(environment, ElasticLauncherEnvironment):
            # rank and size come from the elastic launcher's current generation, once all its ranks are in
            store = _open_store(environment.rendezvous(), rendezvous_timeout)
            clock.lap("store")
            assignment = environment.join(AuthenticatedStore(store, credentials))
            info, prefix = assignment.info, elastic_generation_prefix(assignment.generation)
            first_step_key = elastic_first_step_key(assignment.generation) if info.rank == 0 else None
            _generation = max(_generation, assignment.generation + 1)
            rendezvous = environment.rendezvous()
        else:
            info = environment.rank_info()
            if not 0 <= info.rank < info.size:
                raise ValueError(f"rank {info.rank} is outside a job of size {info.size} ({environment.name})")
            rendezvous = environment.rendezvous()
            store = _open_store(rendezvous, rendezvous_timeout)
            clock.lap("store")
            prefix = generation_prefix(_generation)
        signed = AuthenticatedStore(store, credentials)
        # elastic: every rank joined already, so the meeting waits like a collective (a lost rank fails it in time)
        meeting_timeout = timeout if isinstance(environment, ElasticLauncherEnvironment) else rendezvous_timeout
        # checked before anything starts: the waker and the recorder start before the meeting
        for members in process_sets or []:
            if not members or any(not 0 <= r < info.size for r in members):
                raise ValueError(f"process set ranks {list(members)} must be ranks of this job (size {info.size})")
        lazy = settings.lazy_connect
        parts = RuntimeParts(store, prefix, info.rank, info.size, timeout, lazy, clock)
        waker: Waker = LocalWaker()
        recorder: Recorder = NULL_RECORDER
        wake: DeferredWake | None = None
        report_peer_failure = peer_failure_reporter(environment, signed, info.rank)

        def make_engine(engine_settings: EngineSettings) -> Engine:
            assert parts.control is not None and parts.table is not None and wake is not None
            made = Engine(info.rank, info.size, parts.control, Executor(parts.table, info.rank), parts.table, wake,
                          engine_settings, report_peer_failure, skip_auto_name, deadlock_reporter(environment, signed))
            made.recorder = recorder
            if info.size > 1:
                made.name_peers = functools.partial(name_addresses, store=signed, prefix=prefix)
            return made

        # Groups that connect on first use need nobody else: they, and the engine on them, are made before
        # this rank's arrival is posted (``assembly``). A full mesh would wait for every rank's group with the
        # collective timeout, so it is created after the meeting, which names a rank that never came.
        early = lazy and lazy_connection_available()
        own_values = _shared_engine_values(settings)  # posted at the meeting; the early engine is built with them

        def before_arrival() -> None:
            """Start-up work that needs no answer from the other ranks, done before this rank's arrival is
            posted: every rank but the last still waits for the others then, and what the last one does
            here it does before the others wake (done after the meeting, it competed with every rank's wake-up
            for the CPU: 32 ranks on 2 cores spent 50 ms creating the last rank's group)."""
            nonlocal waker, recorder, wake
            if info.size > 1:
                assert rendezvous.host is not None and rendezvous.port is not None
                waker = StoreWaker(rendezvous.host, rendezvous.port, f"{prefix}/wake/", rendezvous_timeout)
            recorder = open_recorder(settings.flight_record, info.rank, info.size)
            wake = DeferredWake(waker, alarm=FailureAlarm(signed, prefix))
            clock.lap("waker")
            if early:
                parts.open_groups()
                parts.build(process_sets or [], wake)
                parts.engine_for(_engine_settings([own_values], info.rank, settings), make_engine)

        try:  # whatever fails until the engine runs leaves no thread, socket or group behind
            topology, shared_values = meet(signed, prefix, info, own_values, meeting_timeout,
                                           before_arrival=before_arrival)
            clock.lap("rendezvous")
            if not early:
                assert wake is not None
                parts.open_groups()
                parts.build(process_sets or [], wake)
            engine = parts.engine_for(_engine_settings(shared_values, info.rank, settings), make_engine)
            engine.timeline = _initial_timeline(info.rank, settings) or engine.timeline
        except BaseException:
            waker.close()
            recorder.close()
            parts.release()
            raise
        engine.start()
        control_group, table, process_set_ids = parts.control_group, parts.table, parts.process_set_ids
        assert table is not None
        lanes = LaneRegistry(generation_prefix(_generation), _lane_group_opener(store, table, timeout, lazy),
                             lambda: engine.timeline, recorder, report_peer_failure, engine.deadlocks)
        lanes.name_peers = engine.name_peers
        metrics_publisher = _start_metrics(signed, topology, settings)  # never raises (a port in use: a warning)
        clock.lap("engine")
        _runtime = Runtime(environment, topology, store, signed, control_group, table, engine, _generation,
                           dynamic_process_sets, settings, lanes, metrics_publisher, recorder, first_step_key,
                           clock.seconds, wait_spin_s=wake_probe.wait_spin_seconds(settings, topology.local_size))
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
        logger.debug("torchring initialised: %s via %s (%s)", topology, environment.name, clock.summary())
        return process_set_ids


def _runtime_gauges() -> dict[str, object]:
    """The figures of the initialised runtime that the metrics show (none before ``init()``)."""
    runtime = _runtime
    if runtime is None:
        return {}
    cache = runtime.engine.response_cache
    return {"cache_hits": cache.hits, "cache_misses": cache.misses, "size": runtime.topology.size,
            "rank": runtime.topology.rank}


METRICS.runtime_gauges = _runtime_gauges


def _lane_group_opener(store: dist.Store, table: ProcessSetTable, timeout: timedelta, lazy: bool) -> GroupOpener:
    """How gradient lanes get groups: new Gloo (and NCCL) groups over a process set's members."""

    def open_groups(prefix: str, process_set: int) -> DataGroups:
        members = table.members(process_set)
        if members is None:
            raise ValueError(f"process set {process_set} is not registered")
        return data_groups_for(store, prefix, table.set_rank(process_set), len(members), timeout, lazy)

    return open_groups


def _start_metrics(store: AuthenticatedStore, topology: Topology, settings: Settings) -> object | None:
    """Publish metrics to the launcher (``TORCHRING_METRICS_PUBLISH=1``) or serve them on
    ``TORCHRING_METRICS_PORT`` + local rank; nothing when neither is set."""
    if not settings.metrics_publish and settings.metrics_port is None:
        return None
    from ..metrics.exporter import start_rank_metrics

    return start_rank_metrics(store, topology.rank, topology.local_rank, settings.metrics_publish,
                              settings.metrics_port)


def shutdown() -> None:
    """Stop the engine on every rank and release the process groups. Safe to call more than once."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is None:
        return
    _release(runtime)
    del runtime  # the reaper destroys the groups now (``group_reaper``), before the interpreter ends
    if not settle(SETTLE_S):
        logger.debug("a retired process group is still referred to or waits for a peer; it stays retired")


def _release(runtime: Runtime) -> None:
    """Stop ``runtime``'s engine, lanes and recorder, and retire its process groups."""
    if runtime.metrics_publisher is not None:
        runtime.metrics_publisher.stop()  # type: ignore[attr-defined]
    runtime.engine.shutdown(timeout=collective_timeout(runtime.settings).total_seconds() + 5)
    runtime.lanes.shutdown()
    runtime.recorder.close()
    for groups in runtime.process_sets.all_groups():
        groups.shutdown()
    DataGroups(runtime.control_group).shutdown()
    runtime.control_group = None


def start_timeline(path: str, mark_cycles: bool = False) -> None:
    """Start (or restart in another file) rank 0's timeline while running; other ranks do nothing."""
    runtime = current()
    if runtime.topology.rank != 0:
        return
    previous = runtime.engine.timeline
    runtime.engine.timeline = TimelineWriter(path, mark_cycles=mark_cycles)
    previous.close()


def stop_timeline() -> None:
    """Stop and close rank 0's timeline; the file stays valid JSON."""
    runtime = current()
    previous, runtime.engine.timeline = runtime.engine.timeline, NullTimeline()
    previous.close()


def note_step() -> None:
    """A training step completed (an optimizer step, an elastic ``commit()``). Rank 0 of an elastic
    generation tells the launcher the first time, which times the job's recovery with it."""
    runtime = _runtime
    if runtime is None or runtime.first_step_key is None:
        return
    key, runtime.first_step_key = runtime.first_step_key, None
    try:
        runtime.signed.set(key, "1")
    except (RuntimeError, OSError) as error:  # the launcher's store is gone: nothing to time
        logger.debug("could not tell the launcher of the first step: %s", error)


def current_or_none() -> Runtime | None:
    """The active runtime, or None before ``init()`` and after ``shutdown()``."""
    return _runtime


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return _runtime is not None


def current() -> Runtime:
    """The active runtime; ``ValueError`` (as Horovod raises) before ``init()``."""
    runtime = _runtime
    if runtime is None:
        raise ValueError(NOT_INITIALIZED_MESSAGE)
    return runtime
