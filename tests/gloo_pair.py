"""Two real Gloo ranks in one test process: each rank's group over its own client of one TCPStore."""

from __future__ import annotations

import threading
from datetime import timedelta

import torch.distributed as dist


def two_rank_groups(port: int, timeout: timedelta) -> list[dist.ProcessGroup]:
    """Rank 0's and rank 1's Gloo group, created at once on two threads (each connects to the other)."""
    groups: list = [None, None]

    def connect(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("gloo", client), rank, 2, timeout)

    connecting = [threading.Thread(target=connect, args=(rank,)) for rank in (0, 1)]
    for thread in connecting:
        thread.start()
    for thread in connecting:
        thread.join()
    return groups
