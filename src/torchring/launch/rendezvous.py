"""The store the launcher serves for its workers: torchring's rendezvous and torchrun's env:// alike.

It listens only where the job needs it: on loopback when every rank runs on this host, on one address
when the hosts reach this one through it, on every interface otherwise (see ``docs/security.md``).
Everything torchring reads from it that another process wrote goes through :attr:`RendezvousServer.auth`,
which verifies the job's signature (``store_auth``); the credentials are made fresh for each server.

torch is imported when a server starts, not with this module: the launcher's command line, its checks of
the arguments and hosts and its errors come without the two seconds of CPU that loading torch costs.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from datetime import timedelta

from ..contract import DEADLOCK_KEY, own_failure_key, peer_failure_key
from ..rank_failure import OwnFailure, parse_own_failure
from ..store_auth import AuthenticatedStore, JobCredentials

__all__ = ["ALL_INTERFACES", "LOOPBACK", "PEER_FAILURE_MAX_BYTES", "DeadlockRecord", "RendezvousServer",
           "listen_fd_backend", "parse_deadlock"]

#: Bind addresses: loopback only (every rank on this host), or every interface.
LOOPBACK = "127.0.0.1"
ALL_INTERFACES = ""
#: The longest peer-failure record the launcher keeps for a rank.
PEER_FAILURE_MAX_BYTES = 4096


@dataclass(frozen=True)
class DeadlockRecord:
    """A deadlock the ranks' engines confirmed: the ranks to blame and the report's lines."""

    blamed: tuple[int, ...]
    lines: tuple[str, ...]


def parse_deadlock(value: bytes) -> DeadlockRecord | None:
    """The record in ``value`` (verified JSON ``{"blamed": [int], "lines": [str]}``), or None."""
    try:
        data = json.loads(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    blamed, lines = (data.get("blamed"), data.get("lines")) if isinstance(data, dict) else (None, None)
    if not isinstance(blamed, list) or not blamed or not isinstance(lines, list):
        return None
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in blamed):
        return None
    shown = tuple("".join(c if c.isprintable() else "?" for c in line[:400]) for line in lines[:64]
                  if isinstance(line, str))
    return DeadlockRecord(tuple(blamed), shown)


def listen_fd_backend() -> bool:
    """Whether TCPStore's default (libuv) backend serves an already-bound socket (``master_listen_fd``):
    torch >= 2.8. Older versions get the classic backend, which always could."""
    import torch

    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 8)


def _bound_socket(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


class RendezvousServer:
    """A TCPStore server on ``bind``:``port`` (``bind`` "": every interface; ``port`` 0: a free port
    chosen by the system) for the job's lifetime, with the job's fresh credentials."""

    def __init__(self, bind: str = LOOPBACK, port: int = 0, timeout_s: float = 300.0) -> None:
        import torch.distributed as dist

        where = f"{bind or '*'}:{port}"
        timeout = timedelta(seconds=timeout_s)
        try:
            if bind == ALL_INTERFACES:
                self.store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                                           timeout=timeout)
            else:
                sock = _bound_socket(bind, port)
                port = sock.getsockname()[1]
                self.store = dist.TCPStore(bind, port, is_master=True, wait_for_workers=False, timeout=timeout,
                                           master_listen_fd=sock.detach(), use_libuv=listen_fd_backend())
        except (RuntimeError, OSError) as error:
            raise OSError(f"cannot serve the rendezvous store on {where}: {error}. "
                          "Choose another --port or free this one.") from None
        self.bind = bind
        self.port = self.store.port
        self.credentials = JobCredentials.new()
        #: The store's signed view: what the launcher writes for the ranks and reads from them.
        self.auth: AuthenticatedStore | None = AuthenticatedStore(self.store, self.credentials)

    def close(self) -> None:
        """Stop serving (the store's server ends with its last reference)."""
        self.store = None
        self.auth = None

    def own_failure(self, rank: int) -> OwnFailure | None:
        """The exception of its own that rank ``rank`` recorded as it failed (``rank_failure``), if any
        (only a record signed by the job counts)."""
        value = self._signed_value(own_failure_key(rank))
        return None if value is None else parse_own_failure(value)

    def deadlock(self) -> DeadlockRecord | None:
        """The deadlock rank 0's engine confirmed (``runtime.coordination.deadlock``), if any (signed by the job)."""
        value = self._signed_value(DEADLOCK_KEY)
        return None if value is None else parse_deadlock(value)

    def peer_failure(self, rank: int) -> str | None:
        """What rank ``rank`` recorded when its operations failed because of another rank, if anything
        (only a record signed by the job counts)."""
        value = self._signed_value(peer_failure_key(rank))
        return None if value is None else value.decode(errors="replace")

    def _signed_value(self, key: str) -> bytes | None:
        auth = self.auth
        if auth is None:
            return None
        try:
            return auth.get(key, max_bytes=PEER_FAILURE_MAX_BYTES)
        except (RuntimeError, OSError):
            return None
