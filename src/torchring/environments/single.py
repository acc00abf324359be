"""A process started on its own: one rank, no launcher, no network rendezvous."""

from __future__ import annotations

from collections.abc import Mapping

from .base import ClusterEnvironment, RankInfo, Rendezvous


class SingleProcessEnvironment(ClusterEnvironment):
    """Size 1; always applies, so it is tried last."""

    name = "single process"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return True

    def rank_info(self) -> RankInfo:
        return RankInfo(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)

    def rendezvous(self) -> Rendezvous:
        return Rendezvous(None, None)
