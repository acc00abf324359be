"""Workers started by an elastic ``torchring run`` (``--min-np``/``--max-np``): rank and size are not
fixed at start but handed out by the launcher, through the store, for each generation of the job.

At every ``hvd.init()`` (the first, and each one after an elastic reset) the worker waits for a
generation newer than the last one it joined that assigns it a place, announces itself, and waits
until every rank of that generation has arrived. If the launcher publishes a newer generation
meanwhile (another worker failed or a host came), it moves on to that one. Generations, assignments
and arrivals are signed values (``store_auth``): a forged or malformed one is ignored.

A hot spare (``TORCHRING_ELASTIC_SPARE=1``, ``torchring run --spares``) says it stands by
(``contract.elastic_standby_key``) and waits in its first ``hvd.init()`` with no deadline: the launcher
gives it a place when a worker is lost, or stops it. A worker's own deadline is the elastic timeout plus
``DEADLINE_SLACK_S``, so that the launcher, which counts the same timeout from when it saw the job fall
short, is the one that ends a job with too few workers, and says so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from .. import settings
from ..contract import (
    ELASTIC,
    ELASTIC_GENERATION_KEY,
    WORKER_ID,
    elastic_arrived_key,
    elastic_assignment_key,
    elastic_standby_key,
)
from ..store_auth import AuthenticatedStore
from .base import ClusterEnvironment, LaunchEnvironmentError, RankInfo, Rendezvous

_POLL_S = 0.05
#: Seconds a worker waits beyond the elastic timeout before giving up by itself.
DEADLINE_SLACK_S = 30.0
#: The longest generation, assignment or arrival value read from the store.
_MAX_BYTES = 1024


@dataclass(frozen=True)
class Assignment:
    """A worker's place in one generation."""

    generation: int
    info: RankInfo


def format_assignment(info: RankInfo) -> str:
    """How the launcher writes a worker's place."""
    return (f"{info.rank} {info.size} {info.local_rank} {info.local_size} {info.cross_rank} {info.cross_size} "
            f"{info.hostname}")


def parse_assignment(text: str) -> RankInfo:
    """A worker's place as :func:`format_assignment` wrote it; ``ValueError`` for anything else."""
    rank, size, local_rank, local_size, cross_rank, cross_size, hostname = text.split(" ", 6)
    return RankInfo(int(rank), int(size), int(local_rank), int(local_size), int(cross_rank), int(cross_size),
                    hostname)


class ElasticLauncherEnvironment(ClusterEnvironment):
    """``TORCHRING_ELASTIC=1`` and ``TORCHRING_WORKER_ID``: ranks come from the launcher, per generation."""

    name = "torchring elastic launcher"
    #: The last generation this process joined (a process joins each generation at most once).
    joined_generation = -1

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return env.get(ELASTIC) == "1" and bool(env.get(WORKER_ID))

    @property
    def worker_id(self) -> str:
        return self.env[WORKER_ID]

    def rank_info(self) -> RankInfo:
        raise LaunchEnvironmentError("an elastic worker learns its rank from the launcher at init (join())")

    def rendezvous(self) -> Rendezvous:
        host, port = self.store_address()
        return Rendezvous(host, port)

    def timeout_s(self) -> float:
        return settings.read("ELASTIC_TIMEOUT", self.env)

    def standing_by(self) -> bool:
        """A hot spare that has not joined a generation yet."""
        return settings.read("ELASTIC_SPARE", self.env) and ElasticLauncherEnvironment.joined_generation < 0

    def join(self, store: AuthenticatedStore) -> Assignment:
        """Wait for this worker's place in a new generation and for every rank of it to arrive."""
        deadline = time.monotonic() + self.timeout_s() + DEADLINE_SLACK_S
        if self.standing_by():
            warm_up()
            store.set(elastic_standby_key(self.worker_id), "1")
        while True:
            generation = _current_generation(store)
            info = None
            if generation > ElasticLauncherEnvironment.joined_generation:
                info = _assignment(store, elastic_assignment_key(generation, self.worker_id))
            if info is not None:
                store.set(elastic_arrived_key(generation, info.rank), "1")
                if _wait_for_generation(store, generation, info.size, deadline):
                    ElasticLauncherEnvironment.joined_generation = generation
                    return Assignment(generation, info)
                continue  # superseded by a newer generation: join that one
            if self.standing_by():
                deadline = time.monotonic() + self.timeout_s() + DEADLINE_SLACK_S
            elif time.monotonic() > deadline:
                raise RuntimeError(
                    f"elastic worker {self.worker_id}: the launcher assigned no place in a new generation within "
                    f"{self.timeout_s():.0f} s (TORCHRING_ELASTIC_TIMEOUT); the job has too few workers left")
            time.sleep(_POLL_S)


def warm_up() -> None:
    """Pay, while standing by, what a training script pays on first use after ``hvd.init()``: creating
    the first ``torch.optim`` optimizer imports ``torch._dynamo`` (about 1.5 s of CPU)."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001 - an optional speed-up; the script imports it itself otherwise
        pass


def _assignment(store: AuthenticatedStore, key: str) -> RankInfo | None:
    value = store.get(key, max_bytes=_MAX_BYTES)
    try:
        return None if value is None else parse_assignment(value.decode())
    except (ValueError, UnicodeDecodeError):
        store.reject(key, "it is not a worker's place")
        return None


def _current_generation(store: AuthenticatedStore) -> int:
    value = store.get(ELASTIC_GENERATION_KEY, max_bytes=_MAX_BYTES)
    return int(value) if value is not None and value.strip().isdigit() else -1


def _all_arrived(store: AuthenticatedStore, keys: list[str]) -> bool:
    """Every key is set, by a worker of the job (a forged arrival does not count)."""
    return store.check(keys) and all(store.get(key, max_bytes=_MAX_BYTES) is not None for key in keys)


def _wait_for_generation(store: AuthenticatedStore, generation: int, size: int, deadline: float) -> bool:
    """True once every rank of ``generation`` has arrived; False when a newer generation replaced it."""
    keys = [elastic_arrived_key(generation, rank) for rank in range(size)]
    while True:
        if _all_arrived(store, keys):
            return True
        if _current_generation(store) > generation:
            return False
        if time.monotonic() > deadline:
            raise RuntimeError(f"generation {generation} of the elastic job never completed: not every worker "
                               "arrived within the elastic timeout")
        time.sleep(_POLL_S)
