"""Rank discovery: one small class per way a process can be started, tried in a fixed order."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .base import ClusterEnvironment, LaunchEnvironmentError, RankInfo, Rendezvous
from .elastic import ElasticLauncherEnvironment
from .launcher import TorchringLauncherEnvironment
from .mpi import MPIEnvironment
from .single import SingleProcessEnvironment
from .slurm import SlurmEnvironment
from .torchrun import TorchrunEnvironment

#: Detection order: the most specific launcher first, the single process last.
ENVIRONMENTS: tuple[type[ClusterEnvironment], ...] = (
    ElasticLauncherEnvironment,
    TorchringLauncherEnvironment,
    TorchrunEnvironment,
    SlurmEnvironment,
    MPIEnvironment,
    SingleProcessEnvironment,
)


def detect_environment(env: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """The first environment in ``ENVIRONMENTS`` whose variables are present."""
    env = dict(os.environ if env is None else env)
    for candidate in ENVIRONMENTS:
        if candidate.detect(env):
            return candidate(env)
    raise AssertionError("SingleProcessEnvironment always applies")


__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
    "ElasticLauncherEnvironment",
    "LaunchEnvironmentError",
    "MPIEnvironment",
    "RankInfo",
    "Rendezvous",
    "SingleProcessEnvironment",
    "SlurmEnvironment",
    "TorchringLauncherEnvironment",
    "TorchrunEnvironment",
    "detect_environment",
]
