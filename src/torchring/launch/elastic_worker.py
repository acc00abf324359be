"""The elastic driver's records: its settings, one started worker, one membership change."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

from .hang_detector import Probe
from .output import OutputRelay
from .remote_link import RemoteLink
from .supervisor import SSH_CONNECTION_FAILED, describe_returncode


@dataclass(frozen=True)
class ElasticSettings:
    """The elastic flags."""

    min_np: int
    max_np: int
    reset_limit: int | None = None
    elastic_timeout_s: float = 600.0
    cooldown_range_s: tuple[float, float] | None = None
    discovery_interval_s: float = 1.0
    #: ``-np``: how many workers the first generation waits for (default: ``min_np``).
    initial_np: int | None = None
    #: ``--spares``: hot spares kept started on slots beyond ``max_np``.
    spares: int = 0


@dataclass
class ElasticWorker:
    """One worker process; it keeps its id and host while its rank changes from generation to generation."""

    worker_id: str
    host: str
    slot: int
    process: subprocess.Popen
    relays: tuple[OutputRelay, OutputRelay]
    remote: bool
    returncode: int | None = None
    #: Set when the driver ended it (its host left the pool): not counted as a failure.
    removed: bool = False
    #: Its ``remote_rank`` channel (heartbeat), for a remote or container worker.
    link: RemoteLink | None = None
    #: Set when the driver ended it because the hang detector found it stuck or frozen: a failed worker.
    hang_reason: str | None = None
    #: Its rank in each generation that gave it one (generation -> rank).
    ranks: dict[int, int] = field(default_factory=dict)
    #: A hot spare not yet given a place; ``standing_by`` once it said it waits in ``hvd.init()``.
    spare: bool = False
    standing_by: bool = False
    #: How the hang detector samples it (watched once it holds a place).
    probe: Probe | None = None

    @property
    def number(self) -> int:
        """Its number: 3 for worker ``w3``."""
        return int(self.worker_id.removeprefix("w"))

    def ended_how(self) -> str:
        """How it ended, in words: stuck, cut off, or its exit code."""
        lost = self.link.lost_reason if self.link is not None else None
        assert self.returncode is not None
        return self.hang_reason or lost or describe_returncode(self.returncode, self.remote)

    @property
    def alive(self) -> bool:
        return self.returncode is None

    @property
    def running(self) -> bool:
        """Alive and not being stopped by the driver: it can hold a place in a generation."""
        return self.alive and not self.removed

    def unreachable(self) -> str | None:
        """Why its host cannot be reached (its link cut off, its ssh client exited with 255 by itself), else
        None. A worker the driver ended (``hang_reason``) had its ssh client killed, which exits with 255 too."""
        if self.link is not None and self.link.lost_reason:
            return self.link.lost_reason
        if self.remote and self.returncode == SSH_CONNECTION_FAILED and self.hang_reason is None:
            return describe_returncode(self.returncode, self.remote)
        return None


@dataclass
class MembershipChange:
    """What changed in one pass of the driver's loop, in words for the log; ``removed_only`` when nothing
    joined (the running workers may then skip ``sync()``)."""

    reasons: list[str] = field(default_factory=list)
    removed_only: bool = True

    def add(self, reason: str, removal: bool) -> None:
        self.reasons.append(reason)
        self.removed_only = self.removed_only and removal
