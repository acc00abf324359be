"""Local and cross ranks, as Horovod defines them, from what the environment said plus host names."""

from __future__ import annotations

from dataclasses import dataclass


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


def derive_topologies(everyone: list[tuple]) -> list[Topology]:
    """Every rank's topology given each rank's (hostname, local_rank, local_size, cross_rank, cross_size),
    where the environment's values stand and the ``None`` ones are derived from host names: in ``O(N)``,
    so that rank 0 can answer every rank of a large job."""
    hostnames = [e[0] for e in everyone]
    per_host: dict[str, int] = {}
    position_on_host = []
    for name in hostnames:
        position_on_host.append(per_host.get(name, 0))
        per_host[name] = per_host.get(name, 0) + 1
    homogeneous = len(set(per_host.values())) == 1
    # the local rank each rank's cross rank is grouped by: the environment's, else the host position
    grouping = [e[1] if e[1] is not None else position_on_host[r] for r, e in enumerate(everyone)]
    peers: dict[int, list[int]] = {}
    for r, key in enumerate(grouping):
        peers.setdefault(key, []).append(r)
    position_in_group = {r: i for members in peers.values() for i, r in enumerate(members)}
    topologies = []
    for r, (hostname, local_rank, local_size, cross_rank, cross_size) in enumerate(everyone):
        if local_rank is None or local_size is None:
            local_rank, local_size = position_on_host[r], per_host[hostname]
        if cross_rank is None or cross_size is None:
            if grouping[r] != local_rank:  # the environment gave a local rank but no local size
                raise ValueError(f"rank {r}: its local rank {local_rank} disagrees with the other ranks'")
            cross_rank, cross_size = position_in_group[r], len(peers[local_rank])
        topologies.append(Topology(r, len(everyone), local_rank, local_size, cross_rank, cross_size, hostname,
                                   homogeneous))
    return topologies


def derive_topology(rank: int, everyone: list[tuple]) -> Topology:
    """Topology of ``rank`` given each rank's (hostname, local_rank, local_size, cross_rank, cross_size)."""
    return derive_topologies(everyone)[rank]
