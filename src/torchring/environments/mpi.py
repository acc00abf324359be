"""Ranks started by ``mpirun`` (Open MPI, MPICH, Intel MPI: PMI variables), with a store address given."""

from __future__ import annotations

from collections.abc import Mapping

from .base import ClusterEnvironment, RankInfo, Rendezvous


class MPIEnvironment(ClusterEnvironment):
    """``OMPI_COMM_WORLD_*`` or ``PMI_RANK``/``PMI_SIZE``; MASTER_ADDR/MASTER_PORT name the store."""

    name = "MPI"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return bool(env.get("OMPI_COMM_WORLD_RANK") or env.get("PMI_RANK") or env.get("PMIX_RANK"))

    def rank_info(self) -> RankInfo:
        return RankInfo(
            rank=self.required_integer("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"),
            size=self.required_integer("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
            local_rank=self.integer("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
            local_size=self.integer("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"),
        )

    def rendezvous(self) -> Rendezvous:
        host, port = self.store_address()
        return Rendezvous(host, port, serve_store=self.rank_info().rank == 0)
