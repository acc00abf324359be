"""Running a job to its end: the first failing rank stops all the others, and nothing is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .failure_hints import hints_for
from .hang_detector import HangDetector, HangVerdict
from .local import terminate_groups
from .output import OutputRelay
from .remote_link import RemoteLink


@dataclass
class Worker:
    """A started rank: its process and the relays of its output."""

    rank: int
    hostname: str
    process: subprocess.Popen
    relays: tuple[OutputRelay, OutputRelay]
    #: Started over SSH: ``process`` is the ssh client, its exit code the remote supervisor's.
    remote: bool = False
    #: Its ``remote_rank`` channel (heartbeat), for a remote or container rank.
    link: RemoteLink | None = None

    @property
    def stderr_tail(self) -> list[str]:
        return list(self.relays[1].tail)

    @property
    def stderr_shown(self) -> bool:
        """Whether its stderr lines reached the console (not filtered out by ``--ranks``)."""
        return self.relays[1].show

    def ended_how(self) -> str:
        """How it ended, in words (its host cut off, or its exit code)."""
        lost = self.link.lost_reason if self.link is not None else None
        return lost or describe_returncode(self.process.returncode, self.remote)


@dataclass(frozen=True)
class Failure:
    """Why the job ended early."""

    rank: int | None
    hostname: str
    pid: int | None
    returncode: int
    reason: str
    #: Other ranks that failed because of this one: (rank, how it ended, what it recorded).
    consequences: list[tuple[int, str, str]] = field(default_factory=list)
    #: Other ranks that failed on their own (they recorded no failed peer): (rank, how it ended).
    independent: list[tuple[int, str]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return self.returncode if self.returncode > 0 else 128 + (-self.returncode or 1)


#: What ssh returns when the connection failed or dropped.
SSH_CONNECTION_FAILED = 255


def describe_returncode(returncode: int, remote: bool = False) -> str:
    """``exited with code 3`` or ``was killed by signal 9 (SIGKILL)``; for a remote rank, 128 + N is
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


class Supervisor:
    """Watches the workers; ends them all on the first failure or on a signal to the launcher."""

    def __init__(self, grace_period_s: float = 5.0, poll_interval_s: float = 0.05,
                 peer_failure: Callable[[int], str | None] = lambda rank: None,
                 settle_period_s: float = 10.0, detector: HangDetector | None = None) -> None:
        self.workers: list[Worker] = []
        self.grace_period_s = grace_period_s
        self.poll_interval_s = poll_interval_s
        self.peer_failure = peer_failure
        self.settle_period_s = settle_period_s
        #: The hang detector (if on): a hung job ends with its verdict; a failure is checked against it.
        self.detector = detector
        self._stop_signal: int | None = None
        self._wakeup = threading.Event()

    def add(self, worker: Worker) -> None:
        """Watch ``worker`` from now on."""
        self.workers.append(worker)

    def wake(self) -> None:
        """Look at the workers (and the detector's verdict) now."""
        self._wakeup.set()

    def request_stop(self, signum: int) -> None:
        """Called from a signal handler: stop every worker and end the job."""
        self._stop_signal = signum
        self._wakeup.set()

    def wait(self) -> Failure | None:
        """Block until every worker exited successfully (None) or the job failed (the first failure)."""
        failure: Failure | None = None
        try:
            failure = self._watch()
        finally:
            self.terminate_all()
        for worker in self.workers:
            for relay in worker.relays:
                relay.join(timeout=5)
        return failure

    def _watch(self) -> Failure | None:
        while True:
            if self._stop_signal is not None:
                name = signal.Signals(self._stop_signal).name
                return Failure(None, "", None, -self._stop_signal, f"the launcher received {name}")
            if self.detector is not None and self.detector.verdict is not None:
                return self._hang_failure(self.detector.verdict)
            failed = self._failed_workers()
            if failed:
                return self._root_cause(failed)
            if all(worker.process.poll() is not None for worker in self.workers):
                return None
            self._wakeup.wait(self.poll_interval_s)

    def _failed_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.process.poll() not in (None, 0)]

    def _root_cause(self, failed: list[Worker]) -> Failure:
        """The failure that caused the others: a rank whose operations failed because of another rank
        says so in the store, so wait (up to ``settle_period_s``) for the rank it blames to end too. On a
        loaded machine the rank that failed first can take seconds to exit after the others learned of
        it; the wait ends as soon as a failed rank that blames no other appears, a rank is frozen, or every
        rank ended."""
        deadline = time.monotonic() + self.settle_period_s
        while all(self.peer_failure(w.rank) for w in failed) and time.monotonic() < deadline:
            if all(w.process.poll() is not None for w in self.workers):
                break
            if self.detector is not None and self.detector.frozen():
                break  # a stopped rank will not end by itself: blame_after_failure names it
            self._wakeup.wait(self.poll_interval_s)
            failed = self._failed_workers()
        causes = {w.rank: self.peer_failure(w.rank) for w in failed}
        cut_off = [w for w in failed if w.link is not None and w.link.lost_reason]
        root = cut_off[0] if cut_off else next((w for w in failed if not causes[w.rank]), failed[0])
        code = root.process.returncode
        verdict = self.detector.blame_after_failure(root.rank) if self.detector is not None else None
        if verdict is not None:
            return self._hang_failure(verdict, failed)
        others = [w for w in failed if w is not root]
        consequences = [(w.rank, w.ended_how(), causes[w.rank] or "") for w in others if causes[w.rank]]
        independent = [(w.rank, w.ended_how()) for w in others if not causes[w.rank]]
        return Failure(root.rank, root.hostname, None if root.remote else root.process.pid, code,
                       root.ended_how(), consequences, independent)

    def _hang_failure(self, verdict: HangVerdict, failed: Sequence[Worker] = ()) -> Failure:
        """The failure a hang verdict describes: its first rank, and the failed ranks as consequences."""
        rank = verdict.ranks[0]
        blamed = next(w for w in self.workers if w.rank == rank)
        consequences = [(w.rank, w.ended_how(), f"it waited for rank {rank}") for w in failed
                        if w.rank not in verdict.ranks]
        pid = None if blamed.remote else verdict.pids.get(rank) or blamed.process.pid
        return Failure(rank, blamed.hostname, pid, 1, verdict.reason, consequences)

    def terminate_all(self) -> None:
        """SIGTERM every worker's process group, SIGKILL what is left after the grace period."""
        terminate_groups([worker.process for worker in self.workers], self.grace_period_s)


def report_failure(failure: Failure, workers: Sequence[Worker], stream=None) -> None:
    """Print which rank failed, how, the ranks that failed with it, its stderr (its last line when the
    console already showed the rest) and hints for errors it recognises."""
    stream = stream or sys.stderr
    others = len(workers) - 1
    if failure.rank is None:
        print(f"torchring run: {failure.reason}; stopped all {len(workers)} ranks.", file=stream)
        return
    stopped = "; stopped the other rank" if others == 1 else f"; stopped the other {others} ranks" if others else ""
    where = f"pid {failure.pid} on {failure.hostname}" if failure.pid is not None else f"on {failure.hostname}"
    print(f"torchring run: rank {failure.rank} ({where}) {failure.reason}{stopped}.", file=stream)
    for rank, ended in failure.independent:
        print(f"  rank {rank} {ended} too, on its own (it recorded no failure of another rank)", file=stream)
    for rank, ended, cause in failure.consequences:
        print(f"  rank {rank} {ended} as a consequence ({cause})", file=stream)
    worker = next(w for w in workers if w.rank == failure.rank)
    tail = worker.stderr_tail
    if not tail:
        print(f"Rank {failure.rank} wrote nothing to stderr.", file=stream)
    elif worker.stderr_shown:
        print(f"Rank {failure.rank}'s stderr is above (lines starting [{failure.rank}]<stderr>:); its last line: "
              f"{tail[-1].strip()}", file=stream)
    else:
        print(f"Last lines of rank {failure.rank}'s stderr:", file=stream)
        for line in tail:
            print(f"    {line}", file=stream)
    for hint in hints_for(tail):
        print(f"torchring run: hint: {hint}.", file=stream)
    stream.flush()
