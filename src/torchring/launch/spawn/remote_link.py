"""The launcher's link to each ``remote_rank`` supervisor: a heartbeat both ways and stack samples.

The protocol, on the channel ``remote_rank`` already has (SSH, or a pipe for a container on this host):

* the launcher writes lines to its standard input: the JSON spec first, then ``ping`` every
  ``PING_INTERVAL_S``, ``sample N`` to ask for a stack sample, ``stop`` to end the rank;
* ``remote_rank`` relays the rank's stderr line by line and writes its own control lines in between,
  each starting with ``CONTROL_PREFIX``: ``pong`` for each ping, ``probe N <json>`` with a sample's
  :class:`~torchring.launch.sampling.stack_probe.ProbeResult`. A rank's own line that starts with the prefix is
  relayed with a space in front, so a rank cannot forge a control line.

Either side that hears nothing for ``LINK_TIMEOUT_S`` considers the other cut off: the remote supervisor
ends its rank (SIGTERM, then SIGKILL after ``LOST_GRACE_S``), so ranks on a host cut off from the launcher
end within ``LINK_TIMEOUT_S + LOST_GRACE_S``; the launcher ends the ssh client and says which host was
cut off.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable

from ..sampling.stack_probe import ProbeResult
from .local import signal_group

__all__ = ["CONTROL_PREFIX", "LINK_TIMEOUT_S", "LOST_GRACE_S", "PING_INTERVAL_S", "RemoteLink", "RemoteLinks",
           "RemoteProbe"]

#: Starts every control line ``remote_rank`` writes among its rank's stderr lines.
CONTROL_PREFIX = b"\x1etorchring-control:"
PING_INTERVAL_S = 1.0
#: Silence after which either side considers the other cut off.
LINK_TIMEOUT_S = 5.0
#: How long a remote rank gets between SIGTERM and SIGKILL once its launcher is cut off.
LOST_GRACE_S = 2.0
#: The most answers a link keeps (one per outstanding sample is enough).
_MAX_ANSWERS = 4


class RemoteLink:
    """The launcher's side of one ``remote_rank``'s channel."""

    def __init__(self, host: str, process: subprocess.Popen) -> None:
        self.host = host
        self.process = process
        #: When the last control line came (None: none yet, the supervisor is still starting).
        self.last_heard: float | None = None
        #: Why the launcher gave up on this process's host (None: it did not).
        self.lost_reason: str | None = None
        self._lock = threading.Lock()
        self._sequence = 0
        self._answers: dict[int, ProbeResult | None] = {}

    def send(self, line: str) -> bool:
        """Write one command line; False when the channel is closed."""
        stdin = self.process.stdin
        if stdin is None or self.process.poll() is not None:
            return False
        try:
            with self._lock:
                stdin.write(line.encode() + b"\n")
                stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def heard(self) -> None:
        """Any line from the process is a sign of life (a pong may queue behind a burst of output)."""
        self.last_heard = time.monotonic()

    def on_control(self, line: bytes) -> None:
        """A control line from the relay of the process's stderr (``CONTROL_PREFIX`` included)."""
        self.last_heard = time.monotonic()
        kind, _, rest = line[len(CONTROL_PREFIX):].decode(errors="replace").strip().partition(" ")
        if kind != "probe":
            return
        number, _, payload = rest.partition(" ")
        with self._lock:
            if number.isdigit() and int(number) in self._answers:
                self._answers[int(number)] = ProbeResult.from_json(payload)

    def ask_probe(self) -> int | None:
        """Ask for a stack sample; its number, None when the channel is closed."""
        with self._lock:
            self._sequence += 1
            number = self._sequence
            self._answers[number] = None
            for old in sorted(self._answers)[:-_MAX_ANSWERS]:
                del self._answers[old]
        return number if self.send(f"sample {number}") else None

    def answer(self, number: int) -> ProbeResult | None:
        """The answer to sample ``number`` once it came."""
        with self._lock:
            return self._answers.get(number)


class RemoteProbe:
    """A :class:`~torchring.launch.sampling.stack_probe.Probe` for a rank under ``remote_rank``."""

    def __init__(self, link: RemoteLink) -> None:
        self.link = link
        self._number: int | None = None

    def ask(self) -> None:
        self._number = self.link.ask_probe()

    @property
    def done(self) -> bool:
        return self._number is None or self.link.answer(self._number) is not None

    def result(self) -> ProbeResult:
        answer = self.link.answer(self._number) if self._number is not None else None
        return answer or ProbeResult("unsampled")


class RemoteLinks:
    """Pings every registered link; a link silent for ``timeout_s`` is lost: its process (the ssh
    client) is killed and ``on_lost`` is called."""

    def __init__(self, on_lost: Callable[[RemoteLink], None] = lambda link: None,
                 timeout_s: float = LINK_TIMEOUT_S, interval_s: float = PING_INTERVAL_S) -> None:
        self.on_lost = on_lost
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self._links: list[RemoteLink] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, link: RemoteLink) -> None:
        """Watch ``link`` from now on (the pinging thread starts with the first link)."""
        with self._lock:
            self._links.append(link)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="torchring-remote-links", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """End the pinging thread."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            with self._lock:
                links = [link for link in self._links if link.process.poll() is None and link.lost_reason is None]
                self._links = [link for link in self._links if link.process.poll() is None]
            now = time.monotonic()
            for link in links:
                if link.last_heard is not None and now - link.last_heard > self.timeout_s:
                    link.lost_reason = (f"was cut off: no word from {link.host} for {now - link.last_heard:.0f} s "
                                        "(a network partition, or the host is down)")
                    signal_group(link.process, signal.SIGKILL)
                    self.on_lost(link)
                else:
                    link.send("ping")
