"""The launcher's hang detector: samples every rank's Python stack and says when the job is hung.

Every ``interval = clamp(hang_timeout / 10, 1, 30)`` seconds the detector asks each live rank's probe
for a sample: a :class:`~torchring.launch.sampling.stack_probe.StackProbe` for a local rank, a
:class:`~torchring.launch.spawn.remote_link.RemoteProbe` for a rank on another host (its ``remote_rank``
supervisor runs the same probe there). A frozen rank (process state ``T``/``t``) is never signalled.
A rank made progress when its dump differs from the previous one, or when torchring's runtime in it
recorded new collectives or steps (its flight record, ``flight_report``); after each sample the ranks' step
times go to the straggler watch (``stragglers``). The job is hung when no rank made
progress for ``hang_timeout`` seconds; with a rank it cannot sample (a container, a command that is
not Python), only when a rank it can see has been frozen that long. Then the report (``hang_report``)
is printed, written to ``$TMPDIR/torchring-hang-<launcher pid>.txt``, and ``verdict`` is set for the
supervisor to end the job. ``request_report()`` (SIGUSR1 to the launcher) prints the same report and
leaves the job alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..sampling.flight_report import progress_mark, rank_list
from ..sampling.proc_info import is_stopped, process_state
from ..sampling.stack_probe import DUMP_WAIT_S, Probe, ProbeResult, probe_all
from ..spawn.remote_link import RemoteProbe
from .hang_report import (
    RankSample,
    blame,
    format_report,
    hang_reason,
    parse_dump,
    progress_signature,
    waiting_in_collective,
)
from .stragglers import StragglerWatch

__all__ = ["HangDetector", "HangVerdict", "sampling_interval"]

#: The shortest wait between two samples (one made just before a deadline is followed by one at it).
MIN_WAIT_S = 0.05
#: How long one sample waits for remote ranks' answers (their supervisor waits ``DUMP_WAIT_S`` for the dump).
REMOTE_WAIT_S = DUMP_WAIT_S + 1.5


def sampling_interval(hang_timeout_s: float) -> float:
    """Seconds between samples: a tenth of the timeout, at least 1 and at most 30."""
    return min(max(hang_timeout_s / 10, 1.0), 30.0)


@dataclass(frozen=True)
class HangVerdict:
    """The detector's finding: whom to blame, why, and where the full report is."""

    ranks: list[int]
    pids: dict[int, int | None]
    reason: str
    report_path: str | None


@dataclass
class _Tracked:
    rank: int
    process: subprocess.Popen
    probe: Probe | None
    #: The rank's Python process, once a sample named it.
    pid: int | None = None
    text: str = ""
    #: What of its stacks counts for progress (``progress_signature``) at the last sample that read one.
    signature: tuple | None = None
    changed_at: float = 0.0
    frozen_since: float | None = None
    read_at: float | None = None
    last: ProbeResult = ProbeResult("unsampled")
    #: What the rank's runtime last recorded (``TORCHRING_FLIGHT_RECORD``), if anything.
    ops: dict[str, Any] | None = None


class HangDetector:
    """Samples the ranks added with ``add``; a thread of its own once ``start`` is called."""

    def __init__(self, hang_timeout_s: float, log: Callable[[str], None], on_hang: Callable[[], None],
                 report_dir: str | None = None, noun: str = "rank",
                 stragglers: StragglerWatch | None = None) -> None:
        #: Fed the ranks' optimizer steps after every sample (the straggler warning and gauges).
        self.stragglers = stragglers
        #: What the report calls a process: "rank", or "worker" in an elastic job (worker N is ``[wN]``).
        self.noun = noun
        self.hang_timeout_s = hang_timeout_s
        self.interval_s = sampling_interval(hang_timeout_s) if hang_timeout_s > 0 else None
        self.verdict: HangVerdict | None = None
        self._log = log
        self._on_hang = on_hang
        self._report_dir = Path(report_dir or tempfile.gettempdir())
        self._tracked: dict[int, _Tracked] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._report_requested = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="torchring-hang-detector", daemon=True)

    def add(self, rank: int, process: subprocess.Popen, probe: Probe | None) -> None:
        """Watch rank ``rank`` (``probe`` None: it cannot be sampled, e.g. a rank in a container)."""
        with self._lock:
            self._tracked[rank] = _Tracked(rank, process, probe, changed_at=time.monotonic())

    def forget(self, rank: int) -> None:
        """Stop watching ``rank`` (an elastic worker the driver ended) and clear a verdict about it."""
        with self._lock:
            self._tracked.pop(rank, None)
            if self.verdict is not None and rank in self.verdict.ranks:
                self.verdict = None
            for tracked in self._tracked.values():
                tracked.changed_at = time.monotonic()

    def frozen(self) -> list[int]:
        """The live ranks that are stopped now (process state ``T``; for a remote rank, as last sampled)."""
        with self._lock:
            tracked = [t for t in self._tracked.values() if t.process.poll() is None]
        found = []
        for t in tracked:
            if isinstance(t.probe, RemoteProbe):
                stopped = t.last.state == "frozen"
            else:
                stopped = is_stopped(process_state(t.pid or t.process.pid))
            if stopped:
                found.append(t.rank)
        return found

    def note_progress(self) -> None:
        """The job is busy in a way stacks do not show (an elastic job waiting for hosts): restart the clock."""
        with self._lock:
            for tracked in self._tracked.values():
                tracked.changed_at = time.monotonic()

    def start(self) -> None:
        """Start sampling (without ``--hang-timeout`` only reports on request are made)."""
        self._thread.start()

    def stop(self) -> None:
        """End the thread at its next wake-up."""
        self._stopped = True
        self._wakeup.set()

    def request_report(self) -> None:
        """From a signal handler: print the report now (the job goes on)."""
        self._report_requested = True
        self._wakeup.set()

    def _run(self) -> None:
        while not self._stopped:
            self._wakeup.wait(self._next_wait())
            self._wakeup.clear()
            if self._stopped:
                return
            if self._report_requested:
                self._report_requested = False
                samples = self.sample()
                lines, full = format_report(samples, f"stacks of every {self.noun} (on request, the job goes on):",
                                            self.noun)
                self._print(lines, self._write(full, "torchring-stacks"))
            elif self.interval_s is not None:
                self.sample()
                self._watch_stragglers()
                self._check()

    def _next_wait(self) -> float | None:
        """Seconds to the next sample: one interval, or less when the job could be hung sooner (the last
        progress seen, or a rank frozen, plus the timeout), so that a hang is called within the timeout
        plus one interval of the last progress (the interval is how late a sample may see it)."""
        if self.interval_s is None:
            return None
        with self._lock:
            live = [t for t in self._tracked.values() if t.process.poll() is None]
        if not live:
            return self.interval_s
        due = max(t.changed_at for t in live) + self.hang_timeout_s
        frozen = [t.frozen_since for t in live if t.frozen_since is not None]
        if frozen:
            due = min(due, min(frozen) + self.hang_timeout_s)
        remaining = due - time.monotonic()
        if remaining <= 0:  # due and still no verdict (a rank it cannot sample, say): the usual pace
            return self.interval_s
        return min(self.interval_s, max(remaining, MIN_WAIT_S))

    def _watch_stragglers(self) -> None:
        if self.stragglers is None:
            return
        with self._lock:
            steps = {t.rank: t.ops.get("steps") for t in self._tracked.values()
                     if t.ops is not None and t.process.poll() is None}
        if len(steps) > 1:
            self.stragglers.update(steps)

    # ---- sampling ---------------------------------------------------------------------------------

    def sample(self) -> list[RankSample]:
        """Ask every live, sampleable rank for a sample now; what is known of every rank."""
        with self._lock:
            live = [t for t in self._tracked.values() if t.process.poll() is None and t.probe is not None]
            stamp = time.monotonic()  # one time for the whole sample, so ranks compare by sample, not by read
            remote = any(isinstance(t.probe, RemoteProbe) for t in live)
            results = probe_all([t.probe for t in live if t.probe is not None],
                                REMOTE_WAIT_S if remote else DUMP_WAIT_S)
            for tracked, result in zip(live, results, strict=True):
                self._update(tracked, result, stamp)
            return [self._sample_of(t) for t in self._tracked.values()]

    @staticmethod
    def _update(tracked: _Tracked, result: ProbeResult, stamp: float) -> None:
        tracked.last = result
        tracked.pid = result.pid or tracked.pid
        mark = progress_mark(result.ops)
        if mark is not None and mark != progress_mark(tracked.ops):
            tracked.changed_at = stamp  # its runtime recorded new collectives or steps
        tracked.ops = result.ops or tracked.ops
        if result.state == "frozen":
            tracked.frozen_since = tracked.frozen_since or stamp
        else:
            tracked.frozen_since = None
        if result.dump is not None:
            tracked.read_at = stamp
            tracked.text = result.dump
            signature = progress_signature(parse_dump(result.dump))
            if signature != tracked.signature:  # its own code moved on, not only a wait loop of torchring's
                tracked.signature = signature
                tracked.changed_at = stamp

    def _sample_of(self, tracked: _Tracked) -> RankSample:
        now = time.monotonic()
        if tracked.process.poll() is not None:
            return RankSample(tracked.rank, tracked.pid or tracked.process.pid, "exited", parse_dump(tracked.text),
                              tracked.text, ops=tracked.ops)
        state = tracked.last.state
        if state == "unsampled" and tracked.text:
            state = "running"  # no answer this time: its last stack stands
        letter = tracked.last.process_state
        return RankSample(tracked.rank, tracked.pid or (None if isinstance(tracked.probe, RemoteProbe)
                                                        else tracked.process.pid),
                          state, parse_dump(tracked.text), tracked.text,
                          now - (tracked.frozen_since or tracked.changed_at),
                          f"{letter}, stopped" if state == "frozen" else "", tracked.last.cpu_s,
                          None if tracked.read_at is None else now - tracked.read_at, ops=tracked.ops)

    # ---- verdicts ---------------------------------------------------------------------------------

    def _check(self) -> None:
        """Declare the job hung when the rule in the module docstring says so: a rank frozen for the
        timeout, whatever the others do; else no rank's progress for the timeout."""
        now = time.monotonic()
        with self._lock:
            live = [t for t in self._tracked.values() if t.process.poll() is None]
            if not live or self.verdict is not None:
                return
            frozen = {t.rank: now - t.frozen_since for t in live if t.frozen_since is not None}
            frozen_for = max(frozen.values(), default=0.0)
            quiet_for = min(now - t.changed_at for t in live)
            if frozen_for >= self.hang_timeout_s:
                ranks = sorted(rank for rank, since in frozen.items() if since >= self.hang_timeout_s)
                verb = "has" if len(ranks) == 1 else "have"
                why = (f"{rank_list(ranks, self.noun)} {verb} been frozen for {frozen_for:.0f} s "
                       f"(--hang-timeout {self.hang_timeout_s:g})")
            elif all(t.pid is not None for t in live) and quiet_for >= self.hang_timeout_s:
                why = f"no {self.noun} made progress for {quiet_for:.0f} s (--hang-timeout {self.hang_timeout_s:g})"
            else:  # with a rank it cannot sample, only frozen ranks count
                return
        self._declare(why)

    def _declare(self, why: str) -> None:
        with self._lock:  # the report's durations are those the verdict saw, not a fresh sample's
            samples = [self._sample_of(t) for t in self._tracked.values()]
        samples = [s for s in samples if s.state != "exited"]
        blamed = blame(samples) or [s.rank for s in samples]
        lines, full = format_report(samples, f"the job is hung: {why}; where every {self.noun} is:", self.noun)
        path = self._write(full, "torchring-hang")
        self._print(lines, path)
        self.verdict = HangVerdict(blamed, {s.rank: s.pid for s in samples}, hang_reason(samples, blamed, why,
                                                                                          self.noun), path)
        self._on_hang()

    def blame_after_failure(self, failed_rank: int) -> HangVerdict | None:
        """Called when ``failed_rank`` ended with an error: if another live rank is frozen, or stuck outside
        a collective (its stack unchanged in a fresh sample) since a sample before the last one in which
        ``failed_rank`` moved, that rank is the cause."""
        with self._lock:
            failed = self._tracked.get(failed_rank)
            if failed is None:
                return None
            failed_since = failed.changed_at
        samples = [s for s in self.sample() if s.state in ("running", "frozen") and s.rank != failed_rank]
        with self._lock:
            stuck = [s.rank for s in samples if s.state == "frozen"]
            if not stuck:
                stuck = [s.rank for s in samples if s.threads and not waiting_in_collective(s.threads)
                         and self._tracked[s.rank].changed_at < failed_since]
        if not stuck:
            return None
        lines, full = format_report(samples, f"{self.noun} {failed_rank} failed; where the others are:", self.noun)
        path = self._write(full, "torchring-hang")
        self._print(lines, path)
        how = "froze (process state T, stopped)" if any(s.state == "frozen" for s in samples if s.rank in stuck) \
            else "was stuck outside any collective"
        return HangVerdict(stuck, {s.rank: s.pid for s in samples}, f"{how}; {self.noun} {failed_rank} waited for it",
                           path)

    # ---- output -----------------------------------------------------------------------------------

    def _write(self, text: str, stem: str) -> str | None:
        path = self._report_dir / f"{stem}-{os.getpid()}.txt"
        partial = path.with_name(path.name + ".partial")
        try:
            partial.write_text(text)
            os.replace(partial, path)  # whole, for readers such as ``torchring dump``
        except OSError as error:
            self._log(f"cannot write the hang report to {path} ({error.strerror}); set TMPDIR to a writable "
                      "directory")
            return None
        return str(path)

    def _print(self, lines: list[str], path: str | None) -> None:
        for line in lines:
            self._log(line)
        if path:
            self._log(f"full report (every {self.noun}'s whole stack): {path}")
        sys.stderr.flush()
