"""Running a job to its end: the first failing rank stops all the others, and nothing is left behind."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..rank_failure import OwnFailure
from .rendezvous import DeadlockRecord
from .spawn.local import terminate_groups
from .spawn.worker import Worker
from .watch.failure_hints import hints_for
from .watch.hang_detector import HangDetector, HangVerdict


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
    #: Lines printed before the summary (a deadlock's report: where each group of ranks waits).
    details: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return self.returncode if self.returncode > 0 else 128 + (-self.returncode or 1)


#: How long a failed rank that blames no other rank waits for another rank's own-exception record before it
#: is named the cause (a rank that raised records it before it exits, so this is rarely waited out).
CAUSE_WAIT_S = 1.0

#: How long the ranks of a deadlocked job get to exit on their own (each raises the verdict) once one failed.
DEADLOCK_EXIT_WAIT_S = 3.0

class Supervisor:
    """Watches the workers; ends them all on the first failure or on a signal to the launcher."""

    def __init__(self, grace_period_s: float = 5.0, poll_interval_s: float = 0.05,
                 peer_failure: Callable[[int], str | None] = lambda rank: None,
                 settle_period_s: float = 10.0, detector: HangDetector | None = None,
                 own_failure: Callable[[int], OwnFailure | None] = lambda rank: None,
                 cause_wait_s: float = CAUSE_WAIT_S,
                 deadlock: Callable[[], DeadlockRecord | None] = lambda: None) -> None:
        self.workers: list[Worker] = []
        self.grace_period_s = grace_period_s
        self.poll_interval_s = poll_interval_s
        self.peer_failure = peer_failure
        #: A rank's own-exception record (``rank_failure``), read from the store.
        self.own_failure = own_failure
        self.cause_wait_s = cause_wait_s
        #: The deadlock the ranks' engines confirmed (``runtime.coordination.deadlock``), read from the store.
        self.deadlock = deadlock
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
            worker.join_relays()
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
            if all(worker.poll() is not None for worker in self.workers):
                return None
            self._wakeup.wait(self.poll_interval_s)

    def _failed_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.poll() not in (None, 0)]

    def _root_cause(self, failed: list[Worker]) -> Failure:
        """The failure that caused the others, from the ranks' records, not from the order of exits.

        A rank that raised an exception of its own recorded it before it tore anything down, so before
        any peer could notice it leave (``rank_failure``); a rank whose operations failed because of
        another says so too. So wait (up to ``settle_period_s``) until a rank's own exception is on
        record (the earliest is the cause, even while that rank is still exiting), or a failed rank that
        blames no one has stayed unexplained for ``cause_wait_s`` (killed by a signal, ``sys.exit(1)``),
        or a rank is frozen or cut off, or every rank ended."""
        deadlock = self.deadlock()
        if deadlock is not None:  # recorded before any rank raised it
            return self._deadlock_failure(deadlock)
        started = time.monotonic()
        deadline = started + self.settle_period_s
        owns: dict[int, OwnFailure] = {}
        while time.monotonic() < deadline:
            owns = self._own_failures()
            if owns or any(w.link is not None and w.link.lost_reason for w in failed):
                break
            if all(w.poll() is not None for w in self.workers):
                break
            if self.detector is not None and self.detector.frozen():
                break  # a stopped rank will not end by itself: blame_after_failure names it
            unexplained = [w for w in failed if not self.peer_failure(w.rank)]
            if unexplained and time.monotonic() - started >= self.cause_wait_s:
                break
            self._wakeup.wait(self.poll_interval_s)
            failed = self._failed_workers()
        failed = self._failed_workers()
        causes = {w.rank: self.peer_failure(w.rank) for w in self.workers}
        cut_off = [w for w in failed if w.link is not None and w.link.lost_reason]
        if cut_off:
            root = cut_off[0]
        elif owns:
            first = min(owns, key=lambda rank: (owns[rank].at, rank))
            root = next(w for w in self.workers if w.rank == first)
        else:
            root = next((w for w in failed if not causes[w.rank]), failed[0])
        if root.rank not in owns and not cut_off:
            verdict = self.detector.blame_after_failure(root.rank) if self.detector is not None else None
            if verdict is not None:
                return self._hang_failure(verdict, failed)
        others = [w for w in failed if w is not root]
        consequences, independent = [], []
        for worker in others:
            own = owns.get(worker.rank)
            if own is not None and (own.error, own.where) != (owns[root.rank].error, owns[root.rank].where):
                independent.append((worker.rank, f"{worker.ended_how()} after it {own.describe()}"))
            elif causes[worker.rank]:
                consequences.append((worker.rank, worker.ended_how(), causes[worker.rank] or ""))
            elif root.rank in owns:
                consequences.append((worker.rank, worker.ended_how(), f"it ended after rank {root.rank}'s error"))
            else:
                independent.append((worker.rank, worker.ended_how()))
        code = root.process.returncode if root.process.returncode not in (None, 0) else 1
        reason = root.ended_how() if root.process.returncode is not None else "was still exiting"
        if root.rank in owns:
            reason = f"{owns[root.rank].describe()} and {reason}"
        return Failure(root.rank, root.host, None if root.remote else root.process.pid, code,
                       reason, consequences, independent)

    def _deadlock_failure(self, record: DeadlockRecord) -> Failure:
        """A rank failed after the ranks' engines found the job deadlocked (every rank raised the verdict):
        give the others ``DEADLOCK_EXIT_WAIT_S`` to exit with their tracebacks, then blame the odd ranks
        the verdict names. (A job whose ranks catch the verdict and end well is not failed for it.)"""
        deadline = time.monotonic() + DEADLOCK_EXIT_WAIT_S
        while time.monotonic() < deadline and any(w.poll() is None for w in self.workers):
            self._wakeup.wait(self.poll_interval_s)
        known = {w.rank for w in self.workers}
        blamed = [rank for rank in record.blamed if rank in known] or [self.workers[0].rank]
        root = next(w for w in self.workers if w.rank == blamed[0])
        who = "ranks " + ",".join(map(str, blamed)) if len(blamed) > 1 else f"rank {blamed[0]}"
        reason = (f"diverged from the other ranks: {who} waited in a collective the others never submitted, "
                  "while they waited in one it never submitted (a deadlock, see above)")
        consequences = [(w.rank, w.ended_how(), f"it waited for {who}") for w in self._failed_workers()
                        if w.rank not in blamed]
        details = ["the ranks diverged: each waits for a collective that can never complete (deadlock):",
                   *(f"  {line}" for line in record.lines)]
        return Failure(root.rank, root.host, None if root.remote else root.process.pid, 1, reason,
                       consequences, details=details)

    def _own_failures(self) -> dict[int, OwnFailure]:
        """The own-exception records of every rank, failed or still running."""
        found = {}
        for worker in self.workers:
            record = self.own_failure(worker.rank)
            if record is not None:
                found[worker.rank] = record
        return found

    def _hang_failure(self, verdict: HangVerdict, failed: Sequence[Worker] = ()) -> Failure:
        """The failure a hang verdict describes: its first rank, and the failed ranks as consequences."""
        rank = verdict.ranks[0]
        blamed = next(w for w in self.workers if w.rank == rank)
        consequences = [(w.rank, w.ended_how(), f"it waited for rank {rank}") for w in failed
                        if w.rank not in verdict.ranks]
        pid = None if blamed.remote else verdict.pids.get(rank) or blamed.process.pid
        return Failure(rank, blamed.host, pid, 1, verdict.reason, consequences)

    def terminate_all(self) -> None:
        """SIGTERM every worker's process group, SIGKILL what is left after the grace period."""
        terminate_groups([worker.process for worker in self.workers], self.grace_period_s)


#: The longest cause of a consequence shown in the summary (a peer's error can be long).
MAX_CAUSE_CHARS = 200


def _shortened(cause: str) -> str:
    line = cause.strip().splitlines()[0] if cause.strip() else ""
    return line if len(line) <= MAX_CAUSE_CHARS else line[:MAX_CAUSE_CHARS - 1] + "…"


def report_failure(failure: Failure, workers: Sequence[Worker], stream=None) -> None:
    """Print which rank failed, how, the ranks that failed with it, its stderr (its last line when the
    console already showed the rest) and hints for errors it recognises."""
    stream = stream or sys.stderr
    others = len(workers) - 1
    for line in failure.details:
        print(f"torchring run: {line}", file=stream)
    if failure.rank is None:
        print(f"torchring run: {failure.reason}; stopped all {len(workers)} ranks.", file=stream)
        return
    stopped = "; stopped the other rank" if others == 1 else f"; stopped the other {others} ranks" if others else ""
    where = f"pid {failure.pid} on {failure.hostname}" if failure.pid is not None else f"on {failure.hostname}"
    print(f"torchring run: rank {failure.rank} ({where}) {failure.reason}{stopped}.", file=stream)
    for rank, ended in failure.independent:
        print(f"  rank {rank} {ended} too, on its own (it recorded no failure of another rank)", file=stream)
    for rank, ended, cause in failure.consequences:
        print(f"  rank {rank} {ended} as a consequence ({_shortened(cause)})", file=stream)
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
