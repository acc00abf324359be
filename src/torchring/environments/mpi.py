"""Ranks started by ``mpirun`` (Open MPI, MPICH, Intel MPI: PMI variables).

Where the ranks meet comes from ``MASTER_ADDR``/``MASTER_PORT`` (or ``TORCHRING_STORE_ADDR``/``_PORT``)
when they are set; otherwise it travels through MPI itself with ``mpi4py`` (``mpi_bootstrap``), with
a fresh job secret, so that ``mpirun -np 4 -H a:2,b:2 python train.py`` needs nothing set by hand.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..contract import STORE_ADDR
from ..store_auth import adopt_credentials
from .base import ClusterEnvironment, LaunchEnvironmentError, RankInfo, Rendezvous
from .mpi_bootstrap import MPIMeetingPoint, meeting_point_through_mpi, mpi4py_missing_message

#: The variable that tells each MPI implementation's ranks apart, in the order they are looked for.
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


class MPIEnvironment(ClusterEnvironment):
    """``OMPI_COMM_WORLD_*`` or ``PMI_RANK``/``PMI_SIZE``; the store's address given or agreed over MPI."""

    name = "MPI"

    def __init__(self, env: Mapping[str, str]) -> None:
        super().__init__(env)
        self._meeting_point: MPIMeetingPoint | None = None

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return any(env.get(name) for name in _RANK_VARIABLES)

    def rank_info(self) -> RankInfo:
        return RankInfo(
            rank=self.required_integer(*_RANK_VARIABLES),
            size=self.required_integer("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
            local_rank=self.integer("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
            local_size=self.integer("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"),
        )

    def prepare(self) -> None:
        """Without a given address, agree on rank 0's store and a job secret over MPI (collective)."""
        if self.env.get(STORE_ADDR) or self.env.get("MASTER_ADDR"):
            return
        self._meeting_point = meeting_point_through_mpi()
        if self._meeting_point is None:
            variable = next(name for name in _RANK_VARIABLES if self.env.get(name))
            raise LaunchEnvironmentError(mpi4py_missing_message(variable))
        adopt_credentials(self._meeting_point.credentials)

    def rendezvous(self) -> Rendezvous:
        serve = self.rank_info().rank == 0
        if self._meeting_point is not None:
            return Rendezvous(self._meeting_point.host, self._meeting_point.port, serve_store=serve)
        host, port = self.store_address()
        return Rendezvous(host, port, serve_store=serve)
