"""The small supervisor that runs one rank on a remote host: ``python -m torchring.launch.spawn.remote_rank``.

The launcher starts it over SSH and writes one JSON line to its standard input: the command, the
environment and the working directory (so no argument or value ever passes through a remote shell).
It then keeps the SSH channel open. The rank runs in a process group of its own, with its stdout on
the SSH channel and its stderr relayed line by line by this process, which writes its own control
lines in between (``remote_link``): an answer to each ``ping``, and a stack sample of the rank (the
same :class:`~torchring.launch.sampling.stack_probe.StackProbe` the launcher uses for local ranks) for each
``sample N``. When the channel closes (the launcher stopped the job, died, or the connection dropped: stdin
ends, a write fails, or this process's parent, the SSH session, is gone), the launcher writes ``stop``, or
nothing comes from it for the spec's ``link_timeout_s`` (a partition), the whole process group is terminated
(SIGTERM, then SIGKILL after a grace period). When the rank ends, what it
left in its group is killed too, the spec's ``cleanup`` commands run (``docker stop`` for a rank in a
container, which outlives its client), and this process exits with the rank's exit code (128 + N for a
rank killed by signal N).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from ...contract import FLIGHT_RECORD_FILE, STACK_FILE
from ..sampling.stack_probe import STACK_HOOK_PATH, StackProbe, prepare_stack_files, probe_all
from .remote_link import CONTROL_PREFIX, LOST_GRACE_S

GRACE_PERIOD_S = 3.0
CLEANUP_TIMEOUT_S = 20.0
#: Exit code when the rank could not be started at all (as a shell reports a missing command).
CANNOT_START = 127


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class _Channel:
    """This supervisor's side of the launcher's channel: the rank's stderr relayed with control lines
    in between, and the commands read from stdin.

    Whatever tells that the launcher is gone ends the rank: the end of stdin, a write to the channel that
    fails (its other end closed: an exception there must not end the thread that would have stopped the
    rank), this process's parent changing (the SSH session that started it ended), or silence for
    ``link_timeout_s`` (a partition)."""

    def __init__(self, process: subprocess.Popen, link_timeout_s: float | None, probe: StackProbe | None,
                 parent: int) -> None:
        """``parent``: this process's parent when it started (the SSH session, or the launcher)."""
        self.process = process
        #: Silence from the launcher after which the rank is ended (None: never, an older launcher).
        self.link_timeout_s = link_timeout_s
        self.probe = probe
        self.last_heard = time.monotonic()
        self.stopped = threading.Event()
        self._parent = parent
        self._out: BinaryIO = sys.stderr.buffer
        self._lock = threading.Lock()
        self._closed = False
        self._ending = threading.Lock()
        #: Clear while a watcher is saying why it ended the rank (the exit waits for the line, briefly).
        self._said = threading.Event()
        self._said.set()

    def write_line(self, line: bytes) -> bool:
        """Write one line to the launcher; False once the channel is closed (the rank is then being ended)."""
        with self._lock:
            if self._closed:
                return False
            try:
                self._out.write(line)
                self._out.flush()
                return True
            except (OSError, ValueError):
                self._closed = True
        self.end_rank_soon(LOST_GRACE_S)
        return False

    def control(self, text: str) -> None:
        self.write_line(CONTROL_PREFIX + text.encode() + b"\n")

    def relay(self, source: BinaryIO) -> None:
        """Copy the rank's stderr, escaping lines that look like control lines (once the channel is closed,
        the lines are read and dropped, so that the rank never blocks on a full pipe)."""
        for line in iter(source.readline, b""):
            self.write_line((b" " + line) if line.startswith(CONTROL_PREFIX) else line)
        source.close()

    def serve(self) -> None:
        """Answer the launcher's commands until EOF or ``stop``; then end the rank."""
        try:
            for line in sys.stdin:
                self.last_heard = time.monotonic()
                command, _, argument = line.strip().partition(" ")
                if command == "stop":
                    break
                if command == "ping":
                    self.control("pong")
                elif command == "sample" and argument.isdigit():
                    threading.Thread(target=self._sample, args=(argument,), daemon=True).start()
        finally:
            self.end_rank(GRACE_PERIOD_S)

    def _sample(self, number: str) -> None:
        if self.probe is None:
            self.control(f"probe {number} " + json.dumps({"state": "unsampled"}))
            return
        result = probe_all([self.probe])[0]
        self.control(f"probe {number} {result.to_json()}")

    def watch_launcher(self) -> None:
        """End the rank when this process's parent changed (its SSH session ended) or the launcher has been
        silent for ``link_timeout_s``."""
        interval = min(0.5, self.link_timeout_s / 4) if self.link_timeout_s is not None else 0.5
        while not self.stopped.wait(interval):
            if self.process.poll() is not None:
                return
            if os.getppid() != self._parent:
                reason = "the launcher's session ended"
            elif self.link_timeout_s is not None and time.monotonic() - self.last_heard > self.link_timeout_s:
                reason = f"no word from the launcher for {self.link_timeout_s:g} s (cut off)"
            else:
                continue
            self._said.clear()
            self.end_rank_soon(LOST_GRACE_S)  # first: saying why may block on a channel nobody reads
            self.write_line(f"torchring: {reason}; stopping the rank\n".encode())
            self._said.set()
            return

    def wait_for_last_words(self, timeout_s: float = 1.0) -> None:
        """Before this process exits: let a watcher finish saying why it ended the rank (at most
        ``timeout_s``: the channel may be full and unread)."""
        self._said.wait(timeout_s)

    def end_rank_soon(self, grace_s: float) -> None:
        """``end_rank`` on a thread of its own, so that the caller (a relay, a watcher) goes on."""
        threading.Thread(target=self.end_rank, args=(grace_s,), name="torchring-end-rank", daemon=True).start()

    def end_rank(self, grace_s: float) -> None:
        """SIGTERM the rank's process group, SIGKILL it after ``grace_s``; only the first call acts."""
        self.stopped.set()
        if not self._ending.acquire(blocking=False):
            return
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            _signal_group(self.process.pid, signal.SIGCONT)  # a stopped rank gets its SIGTERM too
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.process.pid, signal.SIGKILL)


def _read_spec() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(CANNOT_START)
    return json.loads(line)


def _probe_files(env: dict[str, str]) -> tuple[Path, Path]:
    """A stack file and an flight record for the rank, with the stack hook first on its ``PYTHONPATH``."""
    directory = Path(tempfile.mkdtemp(prefix="torchring-remote-stacks-"))
    stack_file, flight_record_file = prepare_stack_files(directory / "rank")
    env[STACK_FILE], env[FLIGHT_RECORD_FILE] = str(stack_file), str(flight_record_file)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STACK_HOOK_PATH), env.get("PYTHONPATH")) if p)
    return stack_file, flight_record_file


def main() -> int:
    parent = os.getppid()  # before anything else: the session may end while this process starts
    spec = _read_spec()
    env = dict(spec["env"])
    if spec.get("horovod_compat"):
        from ...compat import SHIM_PATH

        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM_PATH), env.get("PYTHONPATH")) if p)
    cwd = spec.get("cwd")
    if cwd and not os.path.isdir(cwd):
        print(f"torchring: working directory {cwd!r} does not exist on this host; run the launcher from a "
              "directory that exists on every host", file=sys.stderr)
        return CANNOT_START
    files = _probe_files(env) if spec.get("probe") else None
    try:
        return _supervise(spec, env, cwd, files, parent)
    finally:
        if files is not None:
            shutil.rmtree(files[0].parent, ignore_errors=True)


def _supervise(spec: dict[str, Any], env: dict[str, str], cwd: str | None, files: tuple[Path, Path] | None,
               parent: int) -> int:
    try:
        process = subprocess.Popen(spec["command"], env=env, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, start_new_session=True)
    except OSError as error:
        print(f"torchring: cannot start {spec['command'][0]!r} on this host: {error.strerror}", file=sys.stderr)
        return CANNOT_START
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda s, _f: _signal_group(process.pid, signal.SIGTERM))
    probe = StackProbe(process.pid, *files) if files is not None else None
    timeout = spec.get("link_timeout_s")
    channel = _Channel(process, float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None, probe,
                       parent)
    assert process.stderr is not None
    relay = threading.Thread(target=channel.relay, args=(process.stderr,), daemon=True)
    relay.start()
    threading.Thread(target=channel.serve, daemon=True).start()
    threading.Thread(target=channel.watch_launcher, daemon=True).start()
    returncode = process.wait()
    _signal_group(process.pid, signal.SIGKILL)  # whatever the rank left behind (DataLoader workers, ...)
    relay.join(timeout=5)
    channel.wait_for_last_words()
    _clean_up(spec.get("cleanup") or [], env)
    return 128 + (-returncode) if returncode < 0 else returncode


def _clean_up(commands: list[list[str]], env: dict[str, str]) -> None:
    """Run the spec's clean-up commands (``docker stop`` for a rank in a container), best effort."""
    for command in commands:
        try:
            subprocess.run(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=CLEANUP_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _flush_quietly() -> None:
    """Flush stdout and stderr; their reader may be gone (the SSH session ended)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    _flush_quietly()
    code = main()
    _flush_quietly()
    os._exit(code)
