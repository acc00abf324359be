"""What a rank tells ``torchring run`` when it fails, so that the launcher blames the cause, not the
rank that happened to exit first.

Two records, both signed with the job's secret (``store_auth``) in the rendezvous store:

- ``own_failure_key(rank)``: the rank's program raised an exception of its own (a ``ValueError`` in
  its training loop). Written by the excepthook this module installs, *before* the interpreter tears
  anything down, so it is in the store before any peer can notice that the rank left. Its value is
  JSON: ``{"at": wall-clock time, "error": "ValueError: ...", "where": "train.py:31"}``.
- ``peer_failure_key(rank)``: the rank's collectives failed because another rank vanished (a closed
  connection, a shut-down peer): a consequence. The engine and the gradient lane write it where the
  error happens; the excepthook writes it for an uncaught error of that kind (a plain DDP rank's
  Gloo error), with the error's first line.

The hook is installed by the stack hook (``launch/sampling/stack_hook/sitecustomize.py``) in the first Python
process of every rank ``torchring run`` starts locally or over SSH, so plain DDP ranks that never
import torchring record too, and by ``init()`` under ``torchring run`` (ranks in containers). It
imports nothing heavy until an exception reaches it; it finds the store through torchring's runtime
or, for a plain ``torch.distributed`` rank, through the default process group. Writing is bounded
(``WRITE_TIMEOUT_S``): a rank never hangs at exit because the launcher is gone.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .contract import ELASTIC, JOB_ID, RANK, own_failure_key, peer_failure_key

__all__ = ["OwnFailure", "caused_by_peer", "install_excepthook", "is_library_file", "note_peer_failure",
           "parse_own_failure", "record_uncaught"]

#: How long the hook waits for the store before it lets the process exit anyway.
WRITE_TIMEOUT_S = 3.0
#: The longest error text recorded.
MAX_ERROR_CHARS = 400

#: Words of errors that mean another rank went away, as Gloo, NCCL and torchring word them (matched in a
#: ``RuntimeError``'s text; torch.distributed's own error types are matched by type).
_PEER_LOSS_WORDS = ("connection closed by peer", "connection reset by peer", "broken pipe", "another rank",
                    "has been shut down", "communicator was aborted", "nccl error", "[gloo/", "gloo/transport")

_installed_in: int | None = None
_recorded = False
_lock = threading.Lock()


class OwnFailure:
    """A rank's own-failure record as the launcher reads it."""

    __slots__ = ("at", "error", "where")

    def __init__(self, at: float, error: str, where: str) -> None:
        self.at = at
        self.error = error
        self.where = where

    def describe(self) -> str:
        """``raised ValueError: bad batch (train.py:31)``."""
        return f"raised {self.error}" + (f" ({self.where})" if self.where else "")


def parse_own_failure(value: bytes) -> OwnFailure | None:
    """The record in ``value`` (already verified), or None when it is not one."""
    try:
        data = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    at, error, where = data.get("at"), data.get("error"), data.get("where", "")
    if isinstance(at, bool) or not isinstance(at, int | float) or not isinstance(error, str) \
            or not isinstance(where, str):
        return None
    printable = "".join(c if c.isprintable() else "?" for c in error[:MAX_ERROR_CHARS])
    return OwnFailure(float(at), printable, "".join(c if c.isprintable() else "?" for c in where[:200]))


def note_peer_failure(report: Callable[[str], None] | None, reason: str) -> None:
    """Tell the launcher through ``report`` (None outside ``torchring run``) that this rank's operations
    failed because of another rank, best effort: the launcher may be gone, the error still reaches the user."""
    if report is None:
        return
    try:
        report(reason)
    except Exception:  # noqa: BLE001 - see above
        pass


def caused_by_peer(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says another rank went away or stopped: a
    torchring ``HorovodInternalError`` or a ``torch.distributed`` error, or an error worded like one."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current)
        if kind.__name__ == "HorovodInternalError" or kind.__module__.startswith("torch.distributed"):
            return True
        text = str(current).lower()
        if isinstance(current, RuntimeError) and any(word in text for word in _PEER_LOSS_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return False


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:MAX_ERROR_CHARS]}" if text else type(error).__name__


#: This package's directory: its frames are never the script's.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def is_library_file(path: str) -> bool:
    """Whether ``path`` is torchring's, an installed package's (torch, the standard library) or frozen
    code: not the script's own, so not where a user looks."""
    if path.startswith("<") or path.startswith(_PACKAGE_DIR):
        return True
    normal = path.replace(os.sep, "/")
    return "/site-packages/" in normal or "/dist-packages/" in normal or normal.startswith(_STDLIB)


_STDLIB = os.path.dirname(os.__file__).replace(os.sep, "/") + "/"


def _where(tb: TracebackType | None) -> str:
    """``train.py:31``: the innermost frame of the traceback in the script's own code."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    for frame in reversed(frames):
        if not is_library_file(frame.filename):
            return f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def _rank() -> int | None:
    runtime = _runtime()
    if runtime is not None:
        return int(runtime.topology.rank)
    try:
        return int(os.environ[RANK])
    except (KeyError, ValueError):
        return None


def _runtime() -> Any:
    context = sys.modules.get("torchring.runtime.context")
    return context.current_or_none() if context is not None else None


def _signed_store() -> Any:
    """The job's signed store: torchring's runtime's, else one over a plain ``torch.distributed`` rank's
    default store (the launcher's store, which ``torchring run`` hands to ``env://``)."""
    runtime = _runtime()
    if runtime is not None:
        return runtime.signed
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store") and type(store).__name__ == "PrefixStore":
        store = store.underlying_store
    from .store_auth import AuthenticatedStore, job_credentials

    return AuthenticatedStore(store, job_credentials())


def record_uncaught(error: BaseException, tb: TracebackType | None) -> None:
    """Tell the launcher about the exception that ends this rank (once per process, bounded in time)."""
    global _recorded
    with _lock:
        if _recorded or isinstance(error, KeyboardInterrupt) or os.environ.get(ELASTIC) == "1":
            return
        _recorded = True
    if JOB_ID not in os.environ or (rank := _rank()) is None:
        return
    if caused_by_peer(error):
        key, value = peer_failure_key(rank), f"it failed with {_first_line(error)}"
    else:
        key = own_failure_key(rank)
        value = json.dumps({"at": time.time(), "error": _first_line(error), "where": _where(tb)})

    def write() -> None:
        try:
            store = _signed_store()
            if store is not None:
                store.set(key, value)
                # a TCPStore set is not answered: this answered request on the same connection returns once the
                # server has the record, before this process exits and the launcher, seeing it gone, reads it
                store.check([key])
        except Exception:  # noqa: BLE001 - the launcher may be gone: the traceback still reaches the user
            pass

    writer = threading.Thread(target=write, name="torchring-failure-record", daemon=True)
    writer.start()
    writer.join(WRITE_TIMEOUT_S)


def install_excepthook() -> None:
    """Record the exception that ends this process before the previous hook prints it (idempotent)."""
    global _installed_in
    if _installed_in == os.getpid():
        return
    _installed_in = os.getpid()
    previous: Callable[..., Any] = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if _installed_in == os.getpid():
            try:
                record_uncaught(error, tb)
            except Exception:  # noqa: BLE001 - never hide the user's traceback
                pass
        previous(kind, error, tb)

    sys.excepthook = hook
