"""The one record of a started process, whoever started it (a fixed job's rank, an elastic worker, a hot
spare), its explicit state, and the one place that says how a process ended.

States: ``RUNNING`` from the start; ``STOPPING`` once the launcher decided to end it (its host left the
pool, training is over, it is no longer needed), ``STOPPED`` when it then ended; ``HUNG`` once the hang
detector's verdict made the launcher end it (a failed worker, ``stop_reason`` says why); ``SUCCEEDED``
and ``FAILED`` when it ended by itself. ``reap`` is the one loop body that notices ended processes.
"""

from __future__ import annotations

import enum
import signal
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..sampling.stack_probe import Probe
from .output import OutputRelay
from .rank_env import Placement
from .remote_link import RemoteLink

__all__ = ["SSH_CONNECTION_FAILED", "LossReport", "ProcessName", "Worker", "WorkerStarter", "WorkerState",
           "describe_returncode", "reap"]

#: What ssh returns when the connection failed or dropped.
SSH_CONNECTION_FAILED = 255


class WorkerState(enum.Enum):
    """Where a started process is in its life."""

    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    HUNG = "hung"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class ProcessName:
    """A process of the job: rank N of a fixed job (``role`` "rank") or elastic worker N ("worker")."""

    role: str
    number: int

    @property
    def label(self) -> str:
        """The output prefix: ``3`` for rank 3, ``w3`` for worker 3."""
        return str(self.number) if self.role == "rank" else f"w{self.number}"

    @property
    def directory(self) -> str:
        """Its directory under ``--output-filename``: ``rank.3`` or ``worker.3``."""
        return f"{self.role}.{self.number}"


def describe_returncode(returncode: int, remote: bool = False) -> str:
    """``exited with code 3`` or ``was killed by signal 9 (SIGKILL)``; for a remote process, 128 + N is
    signal N (the remote supervisor's convention) and 255 a lost SSH connection."""
    if remote and returncode == SSH_CONNECTION_FAILED:
        return "lost its SSH connection (ssh exited with 255)"
    if remote and 128 < returncode < 128 + 65:
        returncode = -(returncode - 128)
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown signal"
    return f"was killed by signal {-returncode} ({name})"


class LossReport(Protocol):
    """What says a process was lost with its host rather than failing by itself: a ``remote_rank`` link, or
    the handle of a Ray actor whose node died."""

    #: Why its host is out of reach, in words (None while it is not).
    lost_reason: str | None


@dataclass
class Worker:
    """A started process, the relays of its output, how to sample it, and its state."""

    name: ProcessName
    host: str
    placement: Placement
    process: subprocess.Popen
    relays: tuple[OutputRelay, OutputRelay]
    #: How the hang detector samples its stack (None: it cannot be sampled).
    probe: Probe | None = None
    #: Its ``remote_rank`` channel (heartbeat, samples), for a process under ``remote_rank``; for a Ray
    #: actor, its handle (which knows whether the actor's node died).
    link: RemoteLink | LossReport | None = None
    #: The slot of its host it holds (its local rank in a fixed job).
    slot: int = 0
    state: WorkerState = WorkerState.RUNNING
    returncode: int | None = None
    #: Why the launcher ended it (a hang verdict), for ``ended_how``.
    stop_reason: str | None = None
    #: Elastic jobs: its rank in each generation that gave it one (generation -> rank).
    ranks: dict[int, int] = field(default_factory=dict)
    #: Elastic jobs: a hot spare not yet given a place; ``standing_by`` once it waits in ``hvd.init()``.
    spare: bool = False
    standing_by: bool = False

    @property
    def number(self) -> int:
        """Its rank (fixed job) or worker number (elastic job)."""
        return self.name.number

    @property
    def rank(self) -> int:
        """A fixed job's rank (the same number as ``number``)."""
        return self.name.number

    @property
    def worker_id(self) -> str:
        """Its label: ``3`` for rank 3, ``w3`` for worker 3."""
        return self.name.label

    @property
    def remote(self) -> bool:
        """Started under ``remote_rank`` (over SSH or for a container): its exit code follows that
        supervisor's convention (128 + N for signal N; 255 from ssh for a lost connection)."""
        return self.placement is not Placement.LOCAL

    @property
    def alive(self) -> bool:
        return self.returncode is None

    @property
    def stopping(self) -> bool:
        """The launcher decided to end it (it may still be exiting)."""
        return self.state in (WorkerState.STOPPING, WorkerState.STOPPED)

    @property
    def running(self) -> bool:
        """Alive and not being stopped: it can hold a place in an elastic generation."""
        return self.alive and self.state is WorkerState.RUNNING

    @property
    def stderr_tail(self) -> list[str]:
        return list(self.relays[1].tail)

    @property
    def stderr_shown(self) -> bool:
        """Whether its stderr lines reached the console (not filtered out by ``--ranks``)."""
        return self.relays[1].show

    def stop(self) -> None:
        """The launcher ends it on purpose: not a failure."""
        if self.alive:
            self.state = WorkerState.STOPPING

    def hung(self, reason: str) -> None:
        """The launcher ends it because the hang detector found it stuck or frozen: a failure."""
        self.state, self.stop_reason = WorkerState.HUNG, reason

    def poll(self) -> int | None:
        """Its exit code once it ended (its state updated then), else None."""
        if self.returncode is not None:
            return self.returncode
        returncode = self.process.poll()
        if returncode is None:
            return None
        self.returncode = returncode
        if self.state is WorkerState.STOPPING:
            self.state = WorkerState.STOPPED
        elif self.state is not WorkerState.HUNG:
            self.state = WorkerState.SUCCEEDED if returncode == 0 else WorkerState.FAILED
        return returncode

    def ended_how(self) -> str:
        """How it ended, in words: stuck, cut off, or its exit code."""
        lost = self.link.lost_reason if self.link is not None else None
        returncode = self.poll()
        how = describe_returncode(returncode, self.remote) if returncode is not None else "was still exiting"
        return self.stop_reason or lost or how

    def unreachable(self) -> str | None:
        """Why its host cannot be reached (its link cut off, its ssh client exited with 255 by itself), else
        None. A process the launcher ended for a hang had its ssh client killed, which exits with 255 too."""
        if self.link is not None and self.link.lost_reason:
            return self.link.lost_reason
        if self.remote and self.returncode == SSH_CONNECTION_FAILED and self.state is not WorkerState.HUNG:
            return describe_returncode(self.returncode, self.remote)
        return None

    def join_relays(self, timeout_s: float = 5.0) -> None:
        """Wait for the rest of its output."""
        for relay in self.relays:
            relay.join(timeout=timeout_s)


class WorkerStarter(Protocol):
    """What starts an elastic job's workers: the job's ``Spawner`` (processes, locally, over SSH or in
    containers), or Ray actors (``torchring.ray.actor_workers``)."""

    def start(self, name: ProcessName, host: str, variables: Mapping[str, str], local_size: int,
              show: bool = True, slot: int = 0) -> Worker:
        """Start ``name`` on ``host`` with the job mode's ``variables``; its output relays are running."""
        ...

    def add_reports(self, reports: Mapping[str, Any]) -> None:
        """Remember remote hosts that passed the SSH preflight."""
        ...


def reap(workers: Iterable[Worker]) -> list[Worker]:
    """The workers among ``workers`` that ended since the last look (their state and exit code set)."""
    return [worker for worker in workers if worker.alive and worker.poll() is not None]
