"""Ranks started by torchrun, a Kubernetes PyTorchJob, or anything else that sets RANK/WORLD_SIZE."""

from __future__ import annotations

from collections.abc import Mapping

from .base import ClusterEnvironment, RankInfo, Rendezvous


class TorchrunEnvironment(ClusterEnvironment):
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``."""

    name = "torchrun"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return bool(env.get("RANK")) and bool(env.get("WORLD_SIZE"))

    def rank_info(self) -> RankInfo:
        size = self.required_integer("WORLD_SIZE")
        local_size = self.integer("LOCAL_WORLD_SIZE")
        cross_rank = self.integer("GROUP_RANK")
        cross_size = self.integer("GROUP_WORLD_SIZE")
        if cross_size is None and local_size and size % local_size == 0 and cross_rank is not None:
            cross_size = size // local_size
        return RankInfo(
            rank=self.required_integer("RANK"),
            size=size,
            local_rank=self.integer("LOCAL_RANK"),
            local_size=local_size,
            cross_rank=cross_rank,
            cross_size=cross_size,
        )

    def rendezvous(self) -> Rendezvous:
        host, port = self.store_address(default_port=29500)
        agent_serves = self.env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        return Rendezvous(host, port, serve_store=not agent_serves and self.rank_info().rank == 0)
