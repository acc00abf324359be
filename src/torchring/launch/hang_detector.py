"""The launcher's hang detector: samples every local rank's Python stack and says when the job is hung.

Each local rank's first Python process registers a ``faulthandler`` dump on SIGUSR2 (``stack_hook``). Every
``interval = clamp(hang_timeout / 10, 1, 30)`` seconds the detector reads each live rank's ``/proc/PID/stat``
(state ``T``/``t`` is frozen; never signalled), sends SIGUSR2 to the others and reads what they appended
to their stack file. A rank made progress when its dump differs from the previous one. The job is hung
when no rank made progress for ``hang_timeout`` seconds; with a rank it cannot sample (remote, container,
a command that is not Python), only when a rank it can see has been frozen that long. Then the report
(``hang_report``) is printed, written to ``$TMPDIR/torchring-hang-<launcher pid>.txt``, and ``verdict``
is set for the supervisor to end the job. ``request_report()`` (SIGUSR1 to the launcher) prints the same
report and leaves the job alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..contract import STACK_FILE_HEADER
from .hang_report import RankSample, blame, format_report, parse_dump, rank_list, waiting_in_collective
from .proc_info import catches_signal, process_state

__all__ = ["HangDetector", "HangVerdict", "sampling_interval"]

#: How long one sample waits for the ranks to write their dumps.
DUMP_WAIT_S = 1.0


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
    stack_file: Path | None
    #: Where the next dump starts: the end of the header line, since each read truncates the file there.
    offset: int = 0
    pid: int | None = None
    text: str = ""
    changed_at: float = 0.0
    frozen_since: float | None = None
    read_at: float | None = None


class HangDetector:
    """Samples the ranks added with ``add``; a thread of its own once ``start`` is called."""

    def __init__(self, hang_timeout_s: float, log: Callable[[str], None], on_hang: Callable[[], None],
                 report_dir: str | None = None, noun: str = "rank") -> None:
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

    def add(self, rank: int, process: subprocess.Popen, stack_file: Path | None) -> None:
        """Watch rank ``rank`` (``stack_file`` None: it cannot be sampled, e.g. a remote rank)."""
        with self._lock:
            self._tracked[rank] = _Tracked(rank, process, stack_file, changed_at=time.monotonic())

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
            self._wakeup.wait(self.interval_s)
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
                self._check()

    # ---- sampling ---------------------------------------------------------------------------------

    def sample(self) -> list[RankSample]:
        """Ask every live, sampleable rank for a dump now; what is known of every rank."""
        with self._lock:
            live = [t for t in self._tracked.values() if t.process.poll() is None]
            stamp = time.monotonic()  # one time for the whole sample, so ranks compare by sample, not by read
            states = {t.rank: self._signal(t) for t in live}
            self._collect([t for t in live if states[t.rank] == "asked"], stamp)
            return [self._sample_of(t, states.get(t.rank, "exited")) for t in self._tracked.values()]

    def _signal(self, tracked: _Tracked) -> str:
        """``frozen``, ``asked`` (sent SIGUSR2) or ``unsampled``."""
        now = time.monotonic()
        if tracked.pid is None and tracked.stack_file is not None:
            tracked.pid = self._header_pid(tracked)
        pid = tracked.pid or tracked.process.pid
        stat = process_state(pid)
        if stat is not None and stat[0] in "Tt":
            tracked.frozen_since = tracked.frozen_since or now
            return "frozen"
        tracked.frozen_since = None
        if tracked.pid is None or stat is None or not catches_signal(tracked.pid, signal.SIGUSR2):
            return "unsampled"
        try:
            os.kill(tracked.pid, signal.SIGUSR2)
        except OSError:
            return "unsampled"
        return "asked"

    def _header_pid(self, tracked: _Tracked) -> int | None:
        assert tracked.stack_file is not None
        try:
            with tracked.stack_file.open() as file:
                header = file.readline()
        except OSError:
            return None
        if not header.startswith(STACK_FILE_HEADER) or not header.endswith("\n"):
            return None
        try:
            pid = int(header[len(STACK_FILE_HEADER):])
            # the rank itself or a process of its group (the rank leads a session of its own)
            if pid != tracked.process.pid and os.getpgid(pid) != tracked.process.pid:
                return None
        except (ValueError, OSError):
            return None
        tracked.offset = len(header.encode())
        return pid

    def _collect(self, asked: list[_Tracked], stamp: float) -> None:
        """Read each asked rank's new dump: wait until its file grew and stopped growing."""
        deadline = time.monotonic() + DUMP_WAIT_S
        sizes = {t.rank: -1 for t in asked}
        pending = list(asked)
        while pending and time.monotonic() < deadline:
            time.sleep(0.02)
            for tracked in list(pending):
                assert tracked.stack_file is not None
                size = tracked.stack_file.stat().st_size
                if size > tracked.offset and size == sizes[tracked.rank]:
                    self._read(tracked, size, stamp)
                    pending.remove(tracked)
                sizes[tracked.rank] = size

    def _read(self, tracked: _Tracked, size: int, stamp: float) -> None:
        assert tracked.stack_file is not None
        with tracked.stack_file.open("rb") as file:
            file.seek(tracked.offset)
            text = file.read(size - tracked.offset).decode(errors="replace")
        try:  # keep the file to its header and one dump at most, however long the job runs
            os.truncate(tracked.stack_file, tracked.offset)
        except OSError:
            tracked.offset = size
        tracked.read_at = stamp
        if text != tracked.text:
            tracked.text = text
            tracked.changed_at = stamp

    def _sample_of(self, tracked: _Tracked, state: str) -> RankSample:
        now = time.monotonic()
        pid = tracked.pid or tracked.process.pid
        stat = process_state(pid) if state != "exited" else None
        sample_state = {"asked": "running"}.get(state, state)
        if state == "unsampled" and tracked.text:
            sample_state = "running"
        unchanged = now - (tracked.frozen_since or tracked.changed_at) if state != "exited" else None
        return RankSample(tracked.rank, pid, sample_state, parse_dump(tracked.text), tracked.text, unchanged,
                          f"{stat[0]}, stopped" if stat and state == "frozen" else "", stat[1] if stat else None,
                          None if tracked.read_at is None else now - tracked.read_at)

    # ---- verdicts ---------------------------------------------------------------------------------

    def _check(self) -> None:
        """Declare the job hung when the rule in the module docstring says so."""
        now = time.monotonic()
        with self._lock:
            live = [t for t in self._tracked.values() if t.process.poll() is None]
            if not live or self.verdict is not None:
                return
            if any(t.pid is None for t in live):  # a rank it cannot sample: only frozen ranks count
                hung = any(t.frozen_since is not None and now - t.frozen_since >= self.hang_timeout_s for t in live)
            else:
                hung = all(now - t.changed_at >= self.hang_timeout_s for t in live)
        if hung:
            self._declare(f"no {self.noun} made progress for {self.hang_timeout_s:g} s")

    def _declare(self, why: str) -> None:
        samples = [s for s in self.sample() if s.state != "exited"]
        blamed = blame(samples) or [s.rank for s in samples]
        lines, full = format_report(samples, f"the job is hung: {why}; where every {self.noun} is:", self.noun)
        path = self._write(full, "torchring-hang")
        self._print(lines, path)
        frozen = [s.rank for s in samples if s.state == "frozen" and s.rank in blamed]
        if frozen:
            reason = f"froze (process state T, stopped) and {why}"
        else:
            reason = f"got stuck outside any collective ({why}; see the report above)"
        if len(blamed) > 1:
            reason += f"; blamed: {rank_list(blamed, self.noun)}"
        self.verdict = HangVerdict(blamed, {s.rank: s.pid for s in samples}, reason, path)
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
