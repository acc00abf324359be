"""The real Horovod as a peer in ``torchring bench``'s own job: its Gloo rendezvous, set up from inside.

Horovod's ranks find each other through the HTTP rendezvous server that ``horovodrun`` starts and the
``HOROVOD_*`` variables it gives each rank. A bench job is started by ``torchring run`` (or torchrun),
so here rank 0 starts that same server (``horovod.runner.http.http_server.RendezvousServer``) with the
job's layout, every rank gets the variables ``horovodrun --gloo`` would have set for it, and
``horovod.torch.init()`` then joins them. torchring and DDP run in the same processes on the same data,
in alternating rounds, so the three are compared on one machine state. Nothing here is needed when the
job was started by ``horovodrun`` (the variables are already set).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist

import torchring

#: What ``horovodrun --gloo`` sets for every rank (besides the rank numbers).
_RENDEZVOUS = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT")


def load_horovod(world_size: int, initialise: bool = True) -> tuple[ModuleType | None, str | None]:
    """Real Horovod's ``horovod.torch``, initialised with this job's ranks (with ``initialise=False``: ready
    for ``hvd.init()``, which the caller then times), or why it cannot be used."""
    try:
        import horovod.torch as hvd
    except ImportError as error:
        return None, f"horovod.torch cannot be imported ({error})"
    package = Path(torchring.__file__).resolve().parent
    if package in Path(hvd.__file__).resolve().parents:
        return None, "horovod.torch is torchring's compatibility shim, not Horovod"
    reason = None if all(name in os.environ for name in _RENDEZVOUS) else _join_this_job()
    if reason is not None:
        return None, reason
    if not initialise:
        return hvd, None
    try:
        hvd.init()
    except Exception as error:  # Horovod raises various types when it has no rendezvous
        return None, f"horovod.torch.init() failed ({type(error).__name__}: {error})"
    if hvd.size() != world_size or hvd.rank() != dist.get_rank():
        return None, f"Horovod sees rank {hvd.rank()} of {hvd.size()}, not {dist.get_rank()} of {world_size}"
    return hvd, None


def everyone_agrees(ok: bool) -> bool:
    """True when every rank of the job says ``ok`` (a collective: every rank must call it)."""
    flag = torch.tensor([1 if ok else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _join_this_job() -> str | None:
    """Start Horovod's rendezvous on rank 0 and set this rank's ``HOROVOD_*`` variables; why not, or None."""
    rank, size = dist.get_rank(), dist.get_world_size()
    hosts: list[str] = [""] * size
    dist.all_gather_object(hosts, socket.gethostname())
    slots = _slots(hosts)
    address = os.environ.get("MASTER_ADDR", "127.0.0.1")
    shared: list[object] = [None]
    if rank == 0:
        shared[0] = _start_rendezvous(hosts, slots)
    dist.broadcast_object_list(shared, src=0)
    port = shared[0]
    if not isinstance(port, int):
        return f"Horovod's rendezvous server could not start on rank 0 ({port})"
    interface = _interface_of(address)
    if interface is None:
        return f"no network interface of this host has {address} (MASTER_ADDR) or routes to it"
    local_rank, local_size, cross_rank, cross_size = slots[rank]
    os.environ.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": address, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": interface,
        "HOROVOD_HOSTNAME": hosts[rank], "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank), "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(cross_rank), "HOROVOD_CROSS_SIZE": str(cross_size),
    })
    return None


def _slots(hosts: list[str]) -> list[tuple[int, int, int, int]]:
    """(local rank, local size, cross rank, cross size) of each rank, from the host each one runs on."""
    order = list(dict.fromkeys(hosts))
    on_host = {host: [rank for rank, h in enumerate(hosts) if h == host] for host in order}
    slots = []
    for rank, host in enumerate(hosts):
        local_rank = on_host[host].index(rank)
        peers = [host_name for host_name in order if len(on_host[host_name]) > local_rank]
        slots.append((local_rank, len(on_host[host]), peers.index(host), len(peers)))
    return slots


def _start_rendezvous(hosts: list[str], slots: list[tuple[int, int, int, int]]) -> int | str:
    """Rank 0: Horovod's HTTP rendezvous for this layout; its port, or the error as text."""
    try:
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousServer
    except ImportError as error:
        return f"this Horovod has no rendezvous server to import: {error}"
    plan = [SlotInfo(hostname=host, rank=rank, local_rank=local_rank, cross_rank=cross_rank, size=len(hosts),
                     local_size=local_size, cross_size=cross_size)
            for rank, (host, (local_rank, local_size, cross_rank, cross_size)) in enumerate(zip(hosts, slots,
                                                                                             strict=True))]
    try:
        server = RendezvousServer(verbose=0)
        port = server.start()
        server.init(plan)
    except Exception as error:  # noqa: BLE001 - reported as the reason Horovod is skipped
        return f"{type(error).__name__}: {error}"
    _SERVERS.append(server)  # serves until this process ends (its thread is a daemon)
    return int(port)


_SERVERS: list[object] = []


def _interface_of(address: str) -> str | None:
    from ..network import interface_of, route_source

    if address in ("127.0.0.1", "localhost"):
        return "lo"
    try:
        resolved = socket.gethostbyname(address)
    except OSError:
        return None
    return interface_of(resolved) or interface_of(route_source(resolved) or "")
