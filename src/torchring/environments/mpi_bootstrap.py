"""Where the ranks of an ``mpirun`` job meet, told through MPI itself (``mpi4py``, the ``[mpi]`` extra).

``mpirun`` gives every process its rank and size but no address to meet at. Rank 0 picks a free port,
lists the addresses of its host, makes a fresh job secret and broadcasts them over ``MPI.COMM_WORLD``;
each rank then reaches rank 0's store through loopback when it runs on rank 0's host, else through the
first of rank 0's addresses that is not also one of its own (an address every host has, a container
bridge's for instance, leads nowhere). The secret never appears on a command line or in the
environment of the processes the ranks start. It runs once per process: a re-init meets at the same
store (rank 0 keeps serving it) under the same secret.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ..contract import JOB_SECRET
from ..network import interface_addresses, route_source
from ..store_auth import JobCredentials

__all__ = ["MPIMeetingPoint", "meeting_point_through_mpi", "mpi4py_missing_message"]

#: An address no host holds (TEST-NET-2): the route towards it is the default route.
_OUTSIDE = "198.51.100.1"
_LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class MPIMeetingPoint:
    """Rank 0's store as this rank reaches it, and the job's credentials."""

    host: str
    port: int
    credentials: JobCredentials


_meeting_point: MPIMeetingPoint | None = None


def mpi4py_missing_message(variable: str) -> str:
    """What to do when ``mpirun`` started the rank (``variable`` is set), no address was given and
    ``mpi4py`` cannot be imported."""
    return (f"torchring was started by mpirun ({variable} is set) but does not know where rank 0 is: install "
            "mpi4py in this Python environment (pip install 'torchring[mpi]'; it uses the MPI library of the "
            "mpirun you run), and rank 0's address and a fresh job secret travel through MPI; or give them "
            "yourself: mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<a free port> ... (the store's "
            "values are then only checked for integrity, unless you also pass a secret of your own: "
            f"-x {JOB_SECRET}=<64 hexadecimal digits>)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _own_addresses() -> list[str]:
    """This host's IPv4 addresses, the default route's first, loopback left out."""
    addresses = [a for a in interface_addresses().values() if not a.startswith("127.")]
    preferred = route_source(_OUTSIDE)
    return sorted(set(addresses), key=lambda address: (address != preferred, address))


def _reachable(rank0_host: str, rank0_addresses: list[str]) -> str:
    """How this rank reaches rank 0's host: loopback on the same host, else the first of rank 0's
    addresses that this host does not hold itself and has a route to."""
    if rank0_host == socket.gethostname():
        return _LOOPBACK
    mine = set(interface_addresses().values())
    for address in rank0_addresses:
        if address not in mine and route_source(address) is not None:
            return address
    raise RuntimeError(f"torchring under mpirun: none of rank 0's addresses ({', '.join(rank0_addresses) or 'none'}, "
                       f"on host {rank0_host}) is reachable from {socket.gethostname()}; set MASTER_ADDR to an "
                       "address of rank 0's host that every host can reach (mpirun -x MASTER_ADDR=...)")


def meeting_point_through_mpi() -> MPIMeetingPoint | None:
    """Rank 0's store address and the job's credentials, agreed over ``MPI.COMM_WORLD`` (collective: every
    rank calls it at its first ``init()``); None when ``mpi4py`` cannot be imported."""
    global _meeting_point
    if _meeting_point is not None:
        return _meeting_point
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    world = MPI.COMM_WORLD
    offer = None
    if world.Get_rank() == 0:
        credentials = JobCredentials.new()
        offer = (socket.gethostname(), _own_addresses(), _free_port(), credentials.job_id, credentials.secret)
    host, addresses, port, job_id, secret = world.bcast(offer, root=0)
    _meeting_point = MPIMeetingPoint(_reachable(host, addresses), port, JobCredentials(job_id, secret))
    return _meeting_point
