"""Ranks started by ``torchring run`` (also accepts the variable names horovodrun sets)."""

from __future__ import annotations

from collections.abc import Mapping

from ..contract import CROSS_RANK, CROSS_SIZE, HOSTNAME, LOCAL_RANK, LOCAL_SIZE, RANK, SIZE, STORE_SERVED, horovod_name
from .base import ClusterEnvironment, RankInfo, Rendezvous


class TorchringLauncherEnvironment(ClusterEnvironment):
    """``TORCHRING_RANK``/``HOROVOD_RANK`` and friends; the launcher serves the store."""

    name = "torchring launcher"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return bool(env.get(RANK) or env.get(horovod_name(RANK)))

    def _field(self, variable: str) -> int | None:
        return self.integer(variable, horovod_name(variable))

    def rank_info(self) -> RankInfo:
        rank = self.required_integer(RANK, horovod_name(RANK))
        size = self.required_integer(SIZE, horovod_name(SIZE))
        return RankInfo(
            rank=rank,
            size=size,
            local_rank=self._field(LOCAL_RANK),
            local_size=self._field(LOCAL_SIZE),
            cross_rank=self._field(CROSS_RANK),
            cross_size=self._field(CROSS_SIZE),
            hostname=self.env.get(HOSTNAME) or self.env.get(horovod_name(HOSTNAME)) or None,
        )

    def rendezvous(self) -> Rendezvous:
        host, port = self.store_address()
        served_by_launcher = self.env.get(STORE_SERVED, "1") != "0"
        return Rendezvous(host, port, serve_store=not served_by_launcher and self.rank_info().rank == 0)
