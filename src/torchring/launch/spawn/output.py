"""Relaying worker output to the console, each line prefixed ``[rank]<stdout>:`` as horovodrun does."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

_console_lock = threading.Lock()


class OutputRelay:
    """Copies one worker stream to the console line by line; keeps its last lines for error reports."""

    def __init__(self, rank: int | str, stream_name: str, source: BinaryIO, sink: BinaryIO, keep_lines: int = 20,
                 show: bool = True, file: BinaryIO | None = None,
                 control: tuple[bytes, Callable[[bytes], None]] | None = None,
                 on_line: Callable[[], None] | None = None, timestamp: bool = False) -> None:
        """``timestamp``: start each console line with the time (``--prefix-output-with-timestamp``, in
        horovodrun's layout: ``Wed Dec  3 23:40:06 2026[0]<stdout>:...``)."""
        self.rank = rank
        self._timestamp = timestamp
        self._prefix = f"[{rank}]<{stream_name}>:".encode()
        self._source = source
        self._sink = sink
        #: Whether lines reach the console; an elastic job changes it when its workers' ranks change.
        self.show = show
        #: Also every line, unprefixed, to this file (``--output-filename``), whatever ``show`` says.
        self._file = file
        self.tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
        #: (prefix, handler): lines that start with the prefix go to the handler, not to the console
        #: (``remote_rank``'s control lines on a remote process's stderr).
        self._control = control
        #: Called for every line (a remote process's link counts its output as a sign of life).
        self._on_line = on_line
        self._thread = threading.Thread(target=self._pump, name=f"relay-{rank}-{stream_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _pump(self) -> None:
        for line in iter(self._source.readline, b""):
            if self._on_line is not None:
                self._on_line()
            if self._control is not None and line.startswith(self._control[0]):
                self._control[1](line)
                continue
            if not line.endswith(b"\n"):
                line += b"\n"
            self.tail.append(line.decode(errors="replace").rstrip("\r\n"))
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            if self.show:
                stamp = time.strftime("%a %b %e %H:%M:%S %Y").encode() if self._timestamp else b""
                with _console_lock:
                    self._sink.write(stamp + self._prefix + line)
                    self._sink.flush()
        self._source.close()
        if self._file is not None:
            self._file.close()
