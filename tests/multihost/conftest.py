"""Fixtures for tests that need several hosts reachable over real SSH (see :mod:`tests.multihost.cluster`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import Cluster, ClusterUnavailable, cluster_unavailable_reason


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
