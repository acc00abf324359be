"""Ranks started by ``torchring run`` (also accepts the variable names horovodrun sets)."""

from __future__ import annotations

from collections.abc import Mapping

from .base import ClusterEnvironment, RankInfo, Rendezvous


class TorchringLauncherEnvironment(ClusterEnvironment):
    """``TORCHRING_RANK``/``HOROVOD_RANK`` and friends; the launcher serves the store."""

    name = "torchring launcher"

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return bool(env.get("TORCHRING_RANK") or env.get("HOROVOD_RANK"))

    def _field(self, suffix: str) -> int | None:
        return self.integer(f"TORCHRING_{suffix}", f"HOROVOD_{suffix}")

    def rank_info(self) -> RankInfo:
        rank = self.required_integer("TORCHRING_RANK", "HOROVOD_RANK")
        size = self.required_integer("TORCHRING_SIZE", "HOROVOD_SIZE")
        return RankInfo(
            rank=rank,
            size=size,
            local_rank=self._field("LOCAL_RANK"),
            local_size=self._field("LOCAL_SIZE"),
            cross_rank=self._field("CROSS_RANK"),
            cross_size=self._field("CROSS_SIZE"),
            hostname=self.env.get("TORCHRING_HOSTNAME") or self.env.get("HOROVOD_HOSTNAME") or None,
        )

    def rendezvous(self) -> Rendezvous:
        host, port = self.store_address()
        served_by_launcher = self.env.get("TORCHRING_STORE_SERVED", "1") != "0"
        return Rendezvous(host, port, serve_store=not served_by_launcher and self.rank_info().rank == 0)
