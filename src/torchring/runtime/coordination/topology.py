"""Local and cross ranks, as Horovod defines them, from what the environment said plus host names."""

from __future__ import annotations

import pickle
import socket
from dataclasses import dataclass

from ...environments import RankInfo
from .control import ControlChannel


@dataclass(frozen=True)
class Topology:
    """Where this rank sits: among all ranks, on its host, and among the ranks of its local rank."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    #: True when every host runs the same number of ranks.
    homogeneous: bool = True


def exchange_topology(info: RankInfo, control: ControlChannel, extra: tuple = ()) -> tuple[Topology, list[tuple]]:
    """Fill in what ``info`` leaves unknown, consistently on every rank, with one exchange; ``extra`` rides
    along (``init()`` sends its engine settings with it) and every rank's comes back, in rank order."""
    hostname = info.hostname or socket.gethostname()
    mine = (hostname, info.local_rank, info.local_size, info.cross_rank, info.cross_size)
    everyone = [pickle.loads(p) for p in control.allgather_bytes(pickle.dumps((mine, extra)))]
    return derive_topology(info.rank, [tuple(e[0]) for e in everyone]), [tuple(e[1]) for e in everyone]


def derive_topology(rank: int, everyone: list[tuple]) -> Topology:
    """Topology of ``rank`` given each rank's (hostname, local_rank, local_size, cross_rank, cross_size)."""
    size = len(everyone)
    hostnames = [e[0] for e in everyone]
    hostname, local_rank, local_size, cross_rank, cross_size = everyone[rank]
    if local_rank is None or local_size is None:
        same_host = [r for r in range(size) if hostnames[r] == hostname]
        local_rank, local_size = same_host.index(rank), len(same_host)
    if cross_rank is None or cross_size is None:
        local_ranks = [
            e[1] if e[1] is not None else [r for r in range(size) if hostnames[r] == e[0]].index(i)
            for i, e in enumerate(everyone)
        ]
        peers = [r for r in range(size) if local_ranks[r] == local_rank]
        cross_rank, cross_size = peers.index(rank), len(peers)
    per_host: dict[str, int] = {}
    for name in hostnames:
        per_host[name] = per_host.get(name, 0) + 1
    homogeneous = len(set(per_host.values())) == 1
    return Topology(rank, size, local_rank, local_size, cross_rank, cross_size, hostname, homogeneous)
