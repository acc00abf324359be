"""Serving metrics in Prometheus's text format with ``prometheus_client``.

Two ways:

* under ``torchring run --metrics-port PORT`` the launcher serves ``PORT`` itself: each rank writes a
  JSON snapshot of its counters to the job's store every ``PUBLISH_INTERVAL_S`` and the launcher's
  collector turns them into metric families with a ``rank`` label, plus ``torchring_job_*`` totals;
* with ``TORCHRING_METRICS_PORT`` and no launcher to collect, each rank serves its own metrics on
  ``PORT + local rank``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..contract import metrics_snapshot_key
from ..store_auth import AuthenticatedStore
from .counters import METRICS, PHASES

logger = logging.getLogger("torchring")

PUBLISH_INTERVAL_S = 1.0
#: The largest snapshot the launcher reads from a rank.
SNAPSHOT_MAX_BYTES = 64 * 1024


def families(snapshots: dict[int, dict[str, Any]]) -> Iterator[Any]:
    """Metric families for the ranks' snapshots: per rank (label ``rank``) and job-wide totals."""
    per_rank: list[tuple[str, str, str, Any]] = [
        ("counter", "torchring_steps", "optimizer steps", lambda s: s["steps"]),
        ("counter", "torchring_samples", "training samples processed", lambda s: s["samples"]),
        ("counter", "torchring_step_seconds", "time between optimizer steps, summed", lambda s: s["step_seconds"]),
        ("counter", "torchring_allreduce_bytes", "bytes reduced", lambda s: s["allreduce_bytes"]),
        ("counter", "torchring_allreduces", "reductions", lambda s: s["allreduces"]),
        ("counter", "torchring_fused_buffers", "fused buffers reduced", lambda s: s["fused_buffers"]),
        ("counter", "torchring_response_cache_hits", "requests negotiated as a cache bit", lambda s: s["cache_hits"]),
        ("counter", "torchring_response_cache_misses", "requests negotiated in full", lambda s: s["cache_misses"]),
        ("counter", "torchring_stalls", "stall warnings", lambda s: s["stalls"]),
        ("counter", "torchring_resets", "elastic resets", lambda s: s["resets"]),
        ("gauge", "torchring_size", "ranks in the job (the membership in elastic mode)", lambda s: s["size"]),
        ("gauge", "torchring_cuda_memory_bytes", "CUDA memory allocated", lambda s: s.get("cuda_memory_bytes")),
        ("gauge", "torchring_gpu_utilization", "GPU utilisation (0..1, NVML)", lambda s: s.get("gpu_utilization")),
    ]
    ranks = sorted(snapshots)
    for kind, name, help_text, value_of in per_rank:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, help_text,
                                                                                  labels=["rank", "host"])
        total, any_value = 0.0, False
        for rank in ranks:
            value = value_of(snapshots[rank])
            if value is None:
                continue
            any_value = True
            total += float(value)
            family.add_metric([str(rank), str(snapshots[rank].get("host", ""))], float(value))
        if any_value:
            yield family
            if kind == "counter":
                job = CounterMetricFamily(name.replace("torchring_", "torchring_job_"), f"{help_text}, all ranks")
                job.add_metric([], total)
                yield job
    phases = CounterMetricFamily("torchring_allreduce_seconds", "time spent in reductions by phase",
                                 labels=["rank", "host", "phase"])
    for rank in ranks:
        for phase in PHASES:
            phases.add_metric([str(rank), str(snapshots[rank].get("host", "")), phase],
                              float(snapshots[rank]["phase_seconds"].get(phase, 0.0)))
    if ranks:
        yield phases
        hits = sum(snapshots[r]["cache_hits"] for r in ranks)
        misses = sum(snapshots[r]["cache_misses"] for r in ranks)
        rate = GaugeMetricFamily("torchring_job_response_cache_hit_rate", "share of requests that hit the cache")
        rate.add_metric([], hits / (hits + misses) if hits + misses else 0.0)
        yield rate


#: What the launcher's straggler watch reports per rank: (lag in seconds, fraction of steps it was last).
StragglerGauges = Callable[[], Mapping[int, tuple[float, float]]]


def straggler_families(gauges: Mapping[int, tuple[float, float]]) -> Iterator[Any]:
    """``torchring_straggler_lag_seconds`` and ``torchring_straggler_last_fraction`` (label ``rank``)
    for the launcher's ``StragglerWatch.gauges()``; nothing when no rank has been seen."""
    if not gauges:
        return
    lag = GaugeMetricFamily("torchring_straggler_lag_seconds",
                            "median seconds a rank reached the gradient reductions after the others, in the "
                            "recent steps it was the last to arrive", labels=["rank"])
    last = GaugeMetricFamily("torchring_straggler_last_fraction",
                             "share of the recent optimizer steps in which the rank was the last to arrive",
                             labels=["rank"])
    for rank in sorted(gauges):
        lag_s, fraction = gauges[rank]
        lag.add_metric([str(rank)], float(lag_s))
        last.add_metric([str(rank)], float(fraction))
    yield lag
    yield last


class _LocalCollector(Collector):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def collect(self) -> Iterator[Any]:
        return families({self.rank: METRICS.snapshot()})


#: Metric families the launcher computes itself (the elastic driver's recovery figures).
LauncherFamilies = Callable[[], Iterator[Any]]


class JobCollector(Collector):
    """The launcher's view: the latest snapshot every rank published in the store, and the launcher's own
    families."""

    def __init__(self, store: AuthenticatedStore, max_ranks: int,
                 straggler_gauges: StragglerGauges | None = None,
                 launcher_families: LauncherFamilies | None = None) -> None:
        self.store = store
        self.max_ranks = max_ranks
        self.straggler_gauges = straggler_gauges
        self.launcher_families = launcher_families

    def collect(self) -> Iterator[Any]:
        snapshots = {}
        for rank in range(self.max_ranks):
            key = metrics_snapshot_key(rank)
            try:
                value = self.store.get(key, max_bytes=SNAPSHOT_MAX_BYTES)
            except (RuntimeError, OSError):
                continue
            snapshot = None if value is None else _snapshot(value)
            if snapshot is not None:
                snapshots[rank] = snapshot
            elif value is not None:
                self.store.reject(key, "it is not a metrics snapshot")
        yield from families(snapshots)
        if self.straggler_gauges is not None:
            yield from straggler_families(self.straggler_gauges())
        if self.launcher_families is not None:
            yield from self.launcher_families()


def _snapshot(value: bytes) -> dict[str, Any] | None:
    """A rank's snapshot if every family can be made of it, else None."""
    try:
        snapshot = json.loads(value)
        list(families({0: snapshot}))
    except Exception:  # noqa: BLE001 - any malformed snapshot is left out, the page still answers
        return None
    return snapshot


def serve_job_metrics(store: AuthenticatedStore, port: int, max_ranks: int, address: str = "0.0.0.0",
                      straggler_gauges: StragglerGauges | None = None,
                      launcher_families: LauncherFamilies | None = None) -> None:
    """On the launcher: serve the ranks' published metrics on ``address``:``port``; with
    ``straggler_gauges`` (``StragglerWatch.gauges``), the straggler gauges too, and with
    ``launcher_families`` the families it yields."""
    registry = CollectorRegistry()
    registry.register(JobCollector(store, max_ranks, straggler_gauges, launcher_families))
    start_http_server(port, addr=address, registry=registry)


class Publisher:
    """On a rank: write this rank's snapshot to the store every ``PUBLISH_INTERVAL_S``."""

    def __init__(self, store: AuthenticatedStore, rank: int) -> None:
        self.store = store
        self.rank = rank
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torchring-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_INTERVAL_S):
            self.publish()

    def publish(self) -> None:
        try:
            self.store.set(metrics_snapshot_key(self.rank), json.dumps(METRICS.snapshot()))
        except Exception:  # noqa: BLE001 - the store may be gone at shutdown; metrics are best effort
            pass

    def stop(self) -> None:
        self._stop.set()
        self.publish()


_served_ports: set[int] = set()


def start_rank_metrics(store: AuthenticatedStore, rank: int, local_rank: int, publish: bool,
                       port: int | None) -> Publisher | None:
    """At ``init``: publish to the launcher, or serve this rank's metrics on ``port + local_rank``."""
    if publish:
        return Publisher(store, rank)
    if port is not None and port + local_rank not in _served_ports:
        registry = CollectorRegistry()
        registry.register(_LocalCollector(rank))
        try:
            start_http_server(port + local_rank, registry=registry)
            _served_ports.add(port + local_rank)
        except OSError as error:
            logger.warning("cannot serve metrics on port %d: %s", port + local_rank, error)
    return None
