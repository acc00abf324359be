"""What every way of starting ranks must tell the runtime: who this rank is and where to meet."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from ..contract import STORE_ADDR, STORE_PORT


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job. Unknown local/cross fields are derived at init from host names."""

    rank: int
    size: int
    local_rank: int | None = None
    local_size: int | None = None
    cross_rank: int | None = None
    cross_size: int | None = None
    hostname: str | None = None


@dataclass(frozen=True)
class Rendezvous:
    """Where ranks meet: a TCPStore at ``host:port``; ``None`` host means a single in-process store."""

    host: str | None
    port: int | None
    serve_store: bool = False


class LaunchEnvironmentError(ValueError):
    """The environment names a launcher but lacks a variable the rank needs."""


class ClusterEnvironment(ABC):
    """One way ranks can be started (a launcher, a scheduler, an MPI runtime)."""

    name: str = "abstract"

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    @classmethod
    @abstractmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        """True when ``env`` shows that this environment started the process."""

    def prepare(self) -> None:  # noqa: B027 - optional: most environments have nothing to learn
        """Learn what the variables do not say, before the job's secret is read and the store is opened
        (the MPI environment agrees on rank 0's address over MPI). Collective where it communicates."""

    @abstractmethod
    def rank_info(self) -> RankInfo:
        """Rank, size and whatever local/cross topology this environment knows."""

    @abstractmethod
    def rendezvous(self) -> Rendezvous:
        """The store the ranks meet at."""

    def integer(self, *names: str, default: int | None = None) -> int | None:
        """The first of ``names`` that is set, as an int; ``default`` when none is."""
        for name in names:
            raw = self.env.get(name)
            if raw not in (None, ""):
                try:
                    return int(raw)
                except ValueError:
                    raise LaunchEnvironmentError(
                        f"{name}={raw!r} is not an integer ({self.name} environment)"
                    ) from None
        return default

    def required_integer(self, *names: str) -> int:
        """Like ``integer`` but missing is an error naming the variables."""
        value = self.integer(*names)
        if value is None:
            raise LaunchEnvironmentError(f"{self.name} environment detected but none of {', '.join(names)} is set")
        return value

    def store_address(self, default_port: int | None = None) -> tuple[str, int]:
        """The rendezvous address from TORCHRING_STORE_ADDR/PORT or MASTER_ADDR/PORT."""
        host = self.env.get(STORE_ADDR) or self.env.get("MASTER_ADDR")
        port = self.integer(STORE_PORT, "MASTER_PORT", default=default_port)
        if not host or port is None:
            raise LaunchEnvironmentError(
                f"{self.name} environment detected, but no rendezvous address: set MASTER_ADDR and "
                "MASTER_PORT (or TORCHRING_STORE_ADDR and TORCHRING_STORE_PORT) to a host:port that "
                "rank 0 can listen on and every rank can reach"
            )
        return host, port
