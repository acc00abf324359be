"""The store the launcher serves for its workers: torchring's rendezvous and torchrun's env:// alike."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from ..contract import peer_failure_key


class RendezvousServer:
    """A TCPStore server on ``port`` (0: a free port chosen by the system) for the job's lifetime."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 300.0) -> None:
        try:
            self.store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=timeout_s))
        except (RuntimeError, OSError) as error:
            raise OSError(f"cannot serve the rendezvous store on {host}:{port}: {error}. "
                          "Choose another --port or free this one.") from None
        self.host = host
        self.port = self.store.port

    def close(self) -> None:
        """Stop serving (the store's server ends with its last reference)."""
        self.store = None

    def peer_failure(self, rank: int) -> str | None:
        """What rank ``rank`` recorded when its operations failed because of another rank, if anything."""
        key = peer_failure_key(rank)
        if self.store is None:
            return None
        try:
            if self.store.check([key]):
                return self.store.get(key).decode(errors="replace")
        except (RuntimeError, OSError):
            pass
        return None
