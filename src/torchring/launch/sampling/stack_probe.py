"""Asking one rank where it is: the probe the hang detector uses for a local rank, and ``remote_rank``
uses on its host for the rank it runs (the answer then travels back over the SSH channel).

A rank's first Python process runs the ``stack_hook``: the stack file's first line names that process,
and a thread of it writes every thread's stack to the file (``faulthandler``'s format) each time a byte
arrives on the FIFO ``<stack file>.trigger``. A probe reads ``/proc/PID/stat`` (state ``T``/``t``:
frozen, never asked), writes the byte, and reads what was appended once the file stopped growing; each
read truncates the file back to its header. When no dump came within ``FALLBACK_S`` (a thread holds the
GIL in a C call), it sends SIGUSR2 once, on which ``faulthandler`` dumps from the signal handler. With an
flight record (``TORCHRING_FLIGHT_RECORD``), what torchring's runtime recorded there (recent collectives, pending
requests, optimizer steps) comes with the answer.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ...contract import STACK_FILE_HEADER
from .flight_report import read_flight_record
from .proc_info import catches_signal, is_stopped, process_state

__all__ = ["DUMP_WAIT_S", "Probe", "ProbeResult", "STACK_HOOK_PATH", "StackProbe", "prepare_stack_files",
           "probe_all"]

#: How long one probe waits for a rank to write its dump.
DUMP_WAIT_S = 2.0
#: How long a probe waits for the rank's dump thread before it falls back to SIGUSR2 (a dump thread on a
#: loaded machine can take a few hundred ms to get the GIL; the fallback is the riskier path).
FALLBACK_S = 1.0
#: The directory whose ``sitecustomize`` registers the stack dump (first on a rank's ``PYTHONPATH``).
STACK_HOOK_PATH = Path(__file__).resolve().parent / "stack_hook"
#: The most of one dump a probe keeps.
MAX_DUMP_CHARS = 512 * 1024


@dataclass(frozen=True)
class ProbeResult:
    """One answer: ``state`` is ``running`` (a dump was read), ``frozen`` (stopped), ``unsampled`` (no
    handler, no dump in time, or gone); ``dump`` the new dump's text (None when none was read)."""

    state: str
    pid: int | None = None
    dump: str | None = None
    #: The process state letter from /proc (``T`` for stopped), "" when unknown.
    process_state: str = ""
    cpu_s: float | None = None
    ops: dict[str, Any] | None = None

    def to_json(self) -> str:
        """One line of JSON (how ``remote_rank`` sends it)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProbeResult | None:
        """Parsed from ``to_json``'s line; None when it is not one (fields are type-checked)."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("state") not in ("running", "frozen", "unsampled"):
            return None
        pid, dump, cpu, ops = data.get("pid"), data.get("dump"), data.get("cpu_s"), data.get("ops")
        return cls(data["state"], pid if isinstance(pid, int) else None,
                   dump[:MAX_DUMP_CHARS] if isinstance(dump, str) else None,
                   str(data.get("process_state") or "")[:1], float(cpu) if isinstance(cpu, (int, float)) else None,
                   ops if isinstance(ops, dict) else None)


def prepare_stack_files(stem: Path) -> tuple[Path, Path]:
    """The stack file (empty), its trigger FIFO and the flight record's path for a rank, named after ``stem``."""
    stack_file = stem.with_name(stem.name + ".stacks")
    stack_file.touch()
    os.mkfifo(trigger_path(stack_file), 0o600)
    return stack_file, stem.with_name(stem.name + ".flight")


def trigger_path(stack_file: Path) -> str:
    """The FIFO that asks the rank for a dump (the stack hook opens ``<stack file>.trigger``)."""
    return str(stack_file) + ".trigger"


class Probe(Protocol):
    """What the detector asks of a probe, local (``StackProbe``) or remote (``remote_link.RemoteProbe``)."""

    def ask(self) -> None:
        """Start a sample."""

    @property
    def done(self) -> bool:
        """Whether the sample's answer is in (or none will come)."""

    def result(self) -> ProbeResult:
        """The sample's answer."""


class StackProbe:
    """Samples the rank whose process-group leader is ``leader_pid`` through ``stack_file``."""

    def __init__(self, leader_pid: int, stack_file: Path, flight_record_file: Path | None = None) -> None:
        self.leader_pid = leader_pid
        self.stack_file = stack_file
        self.flight_record_file = flight_record_file
        #: The Python process that registered the dump (from the file's header), once known.
        self.pid: int | None = None
        #: Where the next dump starts: the end of the header line.
        self._offset = 0
        self._asked = False
        self._asked_at = 0.0
        #: Whether the last sample fell back to SIGUSR2 (the dump thread did not answer in time).
        self.signalled = False
        self._size = -1
        self._dump: str | None = None
        self._state = "unsampled"

    def ask(self) -> None:
        """Check the process state and, when it is not stopped, ask the rank's dump thread for a dump."""
        self._dump, self._asked, self._size, self.signalled = None, False, -1, False
        if self.pid is None:
            self.pid = self._header_pid()
        stat = process_state(self.pid or self.leader_pid)
        if is_stopped(stat):
            self._state = "frozen"
            return
        self._state = "unsampled"
        if self.pid is None or stat is None:
            return
        try:
            trigger = os.open(trigger_path(self.stack_file), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # no FIFO, or no reader: only the signal is left
            self._asked = self._fall_back()
            return
        try:
            os.write(trigger, b"d")
        except OSError:
            self._asked = self._fall_back()
            return
        finally:
            os.close(trigger)
        self._asked, self._asked_at = True, time.monotonic()

    def _fall_back(self) -> bool:
        """SIGUSR2 for ``faulthandler``'s dump, once per sample, when the rank catches it."""
        if self.signalled or self.pid is None or not catches_signal(self.pid, signal.SIGUSR2):
            return False
        try:
            os.kill(self.pid, signal.SIGUSR2)
        except OSError:
            return False
        self.signalled, self._asked_at = True, time.monotonic()
        return True

    @property
    def done(self) -> bool:
        """No dump is awaited any more: not asked, or the file grew and stopped growing."""
        if not self._asked:
            return True
        try:
            size = self.stack_file.stat().st_size
        except OSError:
            self._asked = False
            return True
        if size > self._offset and size == self._size:
            self._read(size)
            self._asked = False
            return True
        self._size = size
        if size <= self._offset and not self.signalled and time.monotonic() - self._asked_at > FALLBACK_S:
            self._fall_back()
        return False

    def result(self) -> ProbeResult:
        """What this probe learned (call once ``done`` or its deadline passed)."""
        pid = self.pid or self.leader_pid
        stat = process_state(pid)
        state = "running" if self._dump is not None else self._state
        ops = read_flight_record(self.flight_record_file) if self.flight_record_file is not None else None
        return ProbeResult(state, self.pid, self._dump, stat[0] if stat else "", stat[1] if stat else None, ops)

    def _header_pid(self) -> int | None:
        try:
            with self.stack_file.open() as file:
                header = file.readline(200)
        except OSError:
            return None
        if not header.startswith(STACK_FILE_HEADER) or not header.endswith("\n"):
            return None
        try:
            pid = int(header[len(STACK_FILE_HEADER):])
            # the rank itself or a process of its group (the rank leads a session of its own)
            if pid != self.leader_pid and os.getpgid(pid) != self.leader_pid:
                return None
        except (ValueError, OSError):
            return None
        self._offset = len(header.encode())
        return pid

    def _read(self, size: int) -> None:
        with self.stack_file.open("rb") as file:
            file.seek(self._offset)
            text = file.read(min(size - self._offset, MAX_DUMP_CHARS)).decode(errors="replace")
        try:  # keep the file to its header and one dump at most, however long the job runs
            os.truncate(self.stack_file, self._offset)
        except OSError:
            self._offset = size
        self._dump = text


def probe_all(probes: Sequence[Probe], wait_s: float = DUMP_WAIT_S) -> list[ProbeResult]:
    """Ask every probe at once, wait (at most ``wait_s``) for their answers, and return their results."""
    for probe in probes:
        probe.ask()
    deadline = time.monotonic() + wait_s
    while not all([probe.done for probe in probes]) and time.monotonic() < deadline:  # poll every probe
        time.sleep(0.02)
    return [probe.result() for probe in probes]
