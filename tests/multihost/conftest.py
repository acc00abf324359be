"""Fixtures for tests that need several hosts reachable over real SSH (see :mod:`tests.multihost.cluster`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import pytest

from .cluster import Cluster, ClusterUnavailable, cluster_unavailable_reason
from .ray_cluster import RayCluster, ray_unavailable_reason
from .slurm_cluster import SlurmCluster, slurm_unavailable_reason


class _Service(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


Service = TypeVar("Service", bound=_Service)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 3-host cluster (``h1``..``h3``) for the whole session; skips where this machine cannot host one."""
    reason = cluster_unavailable_reason()
    if reason is not None:
        pytest.skip(f"multi-host cluster unavailable: {reason}")
    try:
        started = Cluster.start(tmp_path_factory.mktemp("cluster"), num_hosts=3)
    except ClusterUnavailable as error:
        pytest.skip(f"multi-host cluster unavailable: {error}")
    try:
        yield started
    finally:
        started.stop()


def _running(what: str, unavailable_reason: str | None, make: Callable[[], Service]) -> Iterator[Service]:
    """For a module fixture: skip saying why ``what`` cannot run here, else start ``make()``, yield it and stop
    it afterwards (its daemons must not outlive the module: the other tests want empty hosts)."""
    if unavailable_reason is not None:
        pytest.skip(f"no {what}: {unavailable_reason}")
    service = make()
    try:
        service.start()
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module")
def slurm(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """slurmctld on h1 and a slurmd on h1 and h2, for one test module."""
    yield from _running("Slurm cluster", slurm_unavailable_reason(),
                        lambda: SlurmCluster(cluster, tmp_path_factory.mktemp("slurm"), ["h1", "h2"]))


@pytest.fixture(scope="module")
def ray_cluster(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A Ray head node on h1 and a worker node on h2, for one test module."""
    yield from _running("Ray cluster", ray_unavailable_reason(),
                        lambda: RayCluster(cluster, tmp_path_factory.mktemp("ray"), ["h1", "h2"]))
