"""Rank-aware logging and a progress display for training scripts.

``get_logger`` returns a standard :class:`logging.Logger` whose lines go to stderr, prefixed with the
rank and host of the process::

    [rank 0 on node1] 2026-11-30 10:00:00 INFO train: epoch 1 done

Only rank 0 prints unless ``all_ranks=True``. The level comes from ``TORCHRING_LOG_LEVEL``, else
``HOROVOD_LOG_LEVEL`` (Horovod's names: TRACE, DEBUG, INFO, WARNING, ERROR, FATAL), default INFO.

``progress`` wraps an iterable and reports steps, metrics, samples/s and the ETA on rank 0: a tqdm
bar on a terminal, otherwise plain lines at most once per ``min_interval_s``, plus a final line::

    epoch 1: step 120/500 (24%) loss=0.3412 samples/s=5234.1 eta 0:01:12
    epoch 1: step 500/500 (100%) loss=0.2107 samples/s=5301.7 elapsed 0:05:02

The rank is read when needed: from torchring once ``init()`` has run, else from the launcher's
environment (``TORCHRING_RANK``, ``HOROVOD_RANK``, ``RANK``, ``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``,
``SLURM_PROCID``), else 0.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from . import settings
from .contract import RANK, SIZE, horovod_name
from .metrics.counters import record_samples

#: Environment variables holding this process's rank, in the order they are tried.
RANK_VARIABLES = (RANK, horovod_name(RANK), "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
#: Environment variables holding the number of ranks, in the order they are tried.
SIZE_VARIABLES = (SIZE, horovod_name(SIZE), "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")

#: Log line layout; ``rank`` and ``host`` are added to each record when it is emitted.
LOG_FORMAT = "[rank %(rank)s on %(host)s] %(asctime)s %(levelname)s %(name)s: %(message)s"
#: ``HOROVOD_LOG_HIDE_TIME=1`` (``horovodrun --log-hide-timestamp``): the same without the time.
LOG_FORMAT_NO_TIME = "[rank %(rank)s on %(host)s] %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

_clock = time.monotonic  # replaced by tests that need a controlled clock


def _initialised_basics() -> Any | None:
    """The ``torchring.basics`` module when ``init()`` has run, else None."""
    from . import basics

    return basics if basics.is_initialized() else None


def _first_int(names: tuple[str, ...]) -> int | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def current_rank() -> int:
    """This process's rank: from torchring when initialised, else the environment, else 0."""
    basics = _initialised_basics()
    if basics is not None:
        try:
            return basics.rank()
        except ValueError:  # shut down in between
            pass
    found = _first_int(RANK_VARIABLES)
    return 0 if found is None else found


def current_size() -> int:
    """Number of ranks: from torchring when initialised, else the environment, else 1."""
    basics = _initialised_basics()
    if basics is not None:
        try:
            return basics.size()
        except ValueError:
            pass
    found = _first_int(SIZE_VARIABLES)
    return 1 if found is None or found < 1 else found


def log_level() -> int:
    """The :mod:`logging` level named by ``TORCHRING_LOG_LEVEL``/``HOROVOD_LOG_LEVEL`` (INFO when unset).

    It accepts what ``hvd.init()`` accepts (``settings.LOG_LEVELS``)."""
    level = settings.read("LOG_LEVEL")
    return logging.INFO if level is None else level


class RankFilter(logging.Filter):
    """Adds ``rank`` and ``host`` to each record; drops records of ranks other than 0 unless ``all_ranks``."""

    def __init__(self, all_ranks: bool = False) -> None:
        super().__init__()
        self.all_ranks = all_ranks

    def filter(self, record: logging.LogRecord) -> bool:
        rank = current_rank()
        if not (self.all_ranks or rank == 0):
            return False
        record.rank = rank
        record.host = socket.gethostname()
        return True


class RankHandler(logging.StreamHandler):
    """Writes rank-prefixed lines to ``sys.stderr`` as it is at emit time (so redirection is honoured).

    ``setStream`` still works: a stream set explicitly replaces stderr.
    """

    def __init__(self, all_ranks: bool = False) -> None:
        super().__init__()
        self._explicit_stream: TextIO | None = None  # StreamHandler.__init__ stored the stderr of that moment
        self.rank_filter = RankFilter(all_ranks)
        self.addFilter(self.rank_filter)
        hide_time = settings.read("LOG_HIDE_TIME")
        self.setFormatter(logging.Formatter(LOG_FORMAT_NO_TIME if hide_time else LOG_FORMAT, DATE_FORMAT))

    @property
    def stream(self) -> TextIO:  # type: ignore[override]
        return sys.stderr if self._explicit_stream is None else self._explicit_stream

    @stream.setter
    def stream(self, value: TextIO) -> None:
        self._explicit_stream = value


def get_logger(name: str = "train", all_ranks: bool = False) -> logging.Logger:
    """A logger printing ``[rank R on HOST] DATE TIME LEVEL NAME: MESSAGE`` lines to stderr.

    Rank 0 prints; other ranks drop their records unless ``all_ranks`` is true. The level is read
    from ``TORCHRING_LOG_LEVEL``/``HOROVOD_LOG_LEVEL`` at each call (TRACE counts as DEBUG, FATAL as
    CRITICAL). Calling it again with the same name reuses the handler (the latest ``all_ranks`` wins).
    The logger does not propagate to the root logger, so lines are not printed twice.
    """
    logger = logging.getLogger(name)
    logger.setLevel(log_level())
    logger.propagate = False
    handler = next((h for h in logger.handlers if isinstance(h, RankHandler)), None)
    if handler is None:
        logger.addHandler(RankHandler(all_ranks))
    else:
        handler.rank_filter.all_ranks = all_ranks
    return logger


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=max(0, round(seconds))))


def _number(value: Any) -> str:
    if hasattr(value, "item"):  # a tensor or numpy scalar, converted only when shown
        value = value.item()
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


class Progress:
    """Progress of a loop on rank 0; see :func:`progress`."""

    def __init__(self, iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "",
                 unit: str = "it", batch_size: int | None = None, all_ranks: bool = False,
                 stream: TextIO | None = None, min_interval_s: float = 1.0) -> None:
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable = iterable
        self.total = total
        self.desc = desc
        self.unit = unit
        self.batch_size = batch_size
        self.min_interval_s = min_interval_s
        self.stream = sys.stderr if stream is None else stream
        self.n = 0
        self.active = all_ranks or current_rank() == 0
        self.closed = False
        self._metrics: dict[str, Any] = {}
        self._world_size = current_size() if batch_size else 1
        self._start = self._last_line = self._last_postfix = _clock()
        self._bar = self._make_bar() if self.active else None

    def _make_bar(self) -> Any | None:
        isatty = getattr(self.stream, "isatty", None)
        if not (callable(isatty) and isatty()):
            return None
        try:
            from tqdm import tqdm
        except ImportError:  # no tqdm: plain lines on the terminal too
            return None
        return tqdm(total=self.total, desc=self.desc or None, unit=self.unit, file=self.stream, leave=True)

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("progress() was given no iterable; call update() instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def set(self, loss: Any = None, **metrics: Any) -> None:
        """Values shown after the step count (``loss`` first); tensors are converted only when printed."""
        if not self.active:
            return
        if loss is not None:
            metrics = {"loss": loss, **metrics}
        for key, value in metrics.items():
            self._metrics[key] = value.detach() if hasattr(value, "detach") else value

    def set_description(self, desc: str) -> None:
        """Change the text shown before the step count (e.g. the epoch)."""
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description(desc or None, refresh=False)

    def write(self, text: str, file: TextIO | None = None) -> None:
        """Print a line to ``file`` (default: the progress stream) without breaking a bar being drawn.

        It prints on whichever rank calls it; guard it with the rank as for ``print``.
        """
        file = self.stream if file is None else file
        if self._bar is not None:
            self._bar.write(text, file=file)
        else:
            file.write(text + "\n")
        file.flush()

    def update(self, steps: int = 1) -> None:
        """Count ``steps`` finished steps; prints a line when ``min_interval_s`` has passed."""
        self.n += steps
        if self.batch_size:
            record_samples(self.batch_size * steps)  # every rank counts its own samples for the metrics
        if not self.active or self.closed:
            return
        now = _clock()
        if self._bar is not None:
            if now - self._last_postfix >= self._bar.mininterval:
                self._bar.set_postfix_str(self._postfix(now), refresh=False)
                self._last_postfix = now
            self._bar.update(steps)
        elif now - self._last_line >= self.min_interval_s:
            self._write(self._line(now, final=False))
            self._last_line = now

    def close(self) -> None:
        """Finish: the final line (or the completed bar). Safe to call more than once."""
        if self.closed:
            return
        self.closed = True
        if not self.active:
            return
        now = _clock()
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(now), refresh=False)
            self._bar.close()
            self.stream.flush()
        else:
            self._write(self._line(now, final=True))

    def _rate(self, now: float) -> float | None:
        elapsed = now - self._start
        if elapsed <= 0 or self.n == 0:
            return None
        return self.n * (self.batch_size or 1) * self._world_size / elapsed

    def _postfix(self, now: float) -> str:
        parts = [f"{key}={_number(value)}" for key, value in self._metrics.items()]
        rate = self._rate(now)
        if rate is not None:
            parts.append(f"{'samples' if self.batch_size else self.unit}/s={rate:.1f}")
        return " ".join(parts)

    def _line(self, now: float, final: bool) -> str:
        parts = [f"{self.desc}: step" if self.desc else "step"]
        if self.total:
            parts.append(f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)")
        else:
            parts.append(str(self.n))
        postfix = self._postfix(now)
        if postfix:
            parts.append(postfix)
        elapsed = now - self._start
        if final:
            parts.append(f"elapsed {_duration(elapsed)}")
        elif self.total and self.n:
            parts.append(f"eta {_duration(elapsed / self.n * max(0, self.total - self.n))}")
        return " ".join(parts)

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def progress(iterable: Iterable[Any] | None = None, total: int | None = None, desc: str = "", unit: str = "it",
             batch_size: int | None = None, all_ranks: bool = False, stream: TextIO | None = None,
             min_interval_s: float = 1.0) -> Progress:
    """Show the progress of a loop on rank 0 (every rank with ``all_ranks``); other ranks stay silent.

    Iterate over it (``for batch in progress(loader, desc="epoch 1", batch_size=32)``) or use it by hand
    (``with progress(total=500) as bar: ... bar.update()``); ``bar.set(loss=..., acc=...)`` sets the
    values shown. ``total`` defaults to ``len(iterable)``. With ``batch_size`` it shows samples/s over
    the whole job (batch_size x world size x steps / elapsed seconds), else ``unit``/s.

    On a terminal ``stream`` (default stderr) it draws a tqdm bar; otherwise it prints plain lines,
    at most one every ``min_interval_s`` seconds, and a final line when the loop ends or stops early::

        epoch 1: step 120/500 (24%) loss=0.3412 samples/s=5234.1 eta 0:01:12
        epoch 1: step 500/500 (100%) loss=0.2107 samples/s=5301.7 elapsed 0:05:02
    """
    return Progress(iterable, total=total, desc=desc, unit=unit, batch_size=batch_size, all_ranks=all_ranks,
                    stream=stream, min_interval_s=min_interval_s)
