"""Host lists (``-H a:4,b:4``, host files) and the assignment of ranks to their slots."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..environments.slurm_lists import SlurmListError, expand_counts, expand_hostlist


class HostSpecError(ValueError):
    """A host list or host file that cannot be understood; the message says which part and why."""


@dataclass(frozen=True)
class HostSlots:
    """A host and how many ranks it may run."""

    hostname: str
    slots: int


@dataclass(frozen=True)
class SlotAssignment:
    """Where one rank runs and its place in the topology, as Horovod defines it."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    host_index: int
    num_hosts: int


_HOST_RE = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.\-]+)(?::(\S+))?$")


def _parse_entry(entry: str, where: str) -> HostSlots:
    match = _HOST_RE.match(entry)
    if not match:
        raise HostSpecError(f"{where}: malformed host entry {entry!r}; expected HOST or HOST:SLOTS")
    hostname, slots_text = match.group(1).strip("[]"), match.group(2)
    if slots_text is None:
        return HostSlots(hostname, 1)
    if not slots_text.isdigit():
        raise HostSpecError(f"{where}: slots of host {hostname!r} must be a positive integer, got {slots_text!r}")
    slots = int(slots_text)
    if slots == 0:
        raise HostSpecError(f"{where}: host {hostname!r} has 0 slots; give it at least 1 or leave it out")
    return HostSlots(hostname, slots)


def _check_duplicates(hosts: list[HostSlots], where: str) -> list[HostSlots]:
    seen: set[str] = set()
    for host in hosts:
        if host.hostname in seen:
            raise HostSpecError(f"{where}: host {host.hostname!r} is listed twice; list each host once with "
                                "its total number of slots")
        seen.add(host.hostname)
    return hosts


def parse_hosts(text: str) -> list[HostSlots]:
    """Parse ``host1:slots,host2:slots`` (slots default to 1)."""
    entries = [entry.strip() for entry in text.split(",")]
    if not text.strip() or any(not entry for entry in entries):
        raise HostSpecError(f"-H {text!r}: empty host entry; expected host1:slots,host2:slots")
    return _check_duplicates([_parse_entry(entry, f"-H {text!r}") for entry in entries], f"-H {text!r}")


def parse_hostfile(path: str | Path) -> list[HostSlots]:
    """Parse a host file: one ``host slots=N`` (or ``host:N`` or ``host``) per line; ``#`` comments."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise HostSpecError(f"cannot read host file {str(path)!r}: {error.strerror}") from None
    hosts = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\S+)", line)
        entry = f"{match.group(1)}:{match.group(2)}" if match else line
        if " " in entry or "\t" in entry:
            raise HostSpecError(f"{where}: malformed line {raw.strip()!r}; expected 'host slots=N'")
        hosts.append(_parse_entry(entry, where))
    if not hosts:
        raise HostSpecError(f"host file {str(path)!r} lists no hosts")
    return _check_duplicates(hosts, str(path))


@dataclass(frozen=True)
class SlurmAllocation:
    """The nodes of the Slurm allocation ``torchring run`` runs in, with the tasks it may start on each."""

    job_id: str
    hosts: list[HostSlots]
    #: The variable the slot counts came from (``SLURM_TASKS_PER_NODE`` or ``SLURM_JOB_CPUS_PER_NODE``).
    source: str

    def describe(self) -> str:
        listed = ",".join(f"{host.hostname}:{host.slots}" for host in self.hosts)
        return f"Slurm allocation {self.job_id}: {listed} (SLURM_JOB_NODELIST, {self.source})"


def slurm_allocation(environ: Mapping[str, str]) -> SlurmAllocation | None:
    """The allocation of ``salloc``/``sbatch`` this launcher runs in (None outside one, or inside a job
    step, where ``srun`` already started one process per task); ``HostSpecError`` when Slurm's
    variables cannot be read."""
    nodelist, job_id = environ.get("SLURM_JOB_NODELIST"), environ.get("SLURM_JOB_ID")
    if not nodelist or not job_id or environ.get("SLURM_STEP_ID") not in (None, "", "batch", "4294967294"):
        return None
    source = "SLURM_TASKS_PER_NODE" if environ.get("SLURM_TASKS_PER_NODE") else "SLURM_JOB_CPUS_PER_NODE"
    try:
        nodes = expand_hostlist(nodelist)
        counts = expand_counts(environ.get(source) or "1")
    except SlurmListError as error:
        raise HostSpecError(f"cannot read the Slurm allocation's nodes: {error}") from None
    if len(counts) == 1:
        counts = counts * len(nodes)
    if len(counts) != len(nodes):
        raise HostSpecError(f"the Slurm allocation lists {len(nodes)} nodes (SLURM_JOB_NODELIST={nodelist}) but "
                            f"{len(counts)} slot counts ({source}={environ.get(source)}); give -H instead")
    return SlurmAllocation(job_id, [HostSlots(node, max(count, 1)) for node, count in zip(nodes, counts, strict=True)],
                           source)


def assign_ranks(hosts: list[HostSlots], num_proc: int) -> list[SlotAssignment]:
    """Fill hosts in the order given with ``num_proc`` ranks; more ranks than slots is an error."""
    total = sum(host.slots for host in hosts)
    if num_proc < 1:
        raise HostSpecError(f"-np must be at least 1, got {num_proc}")
    if num_proc > total:
        listed = ", ".join(f"{h.hostname}:{h.slots}" for h in hosts)
        raise HostSpecError(f"-np {num_proc} asks for more ranks than the {total} slots available ({listed})")
    placed: list[tuple[int, int]] = []  # (host index, local rank)
    for index, host in enumerate(hosts):
        for local_rank in range(host.slots):
            if len(placed) < num_proc:
                placed.append((index, local_rank))
    used_hosts = sorted({index for index, _ in placed})
    local_sizes = {index: sum(1 for i, _ in placed if i == index) for index in used_hosts}
    assignments = []
    for rank, (index, local_rank) in enumerate(placed):
        peers = [i for i, lr in placed if lr == local_rank]
        assignments.append(SlotAssignment(
            rank=rank, size=num_proc, local_rank=local_rank, local_size=local_sizes[index],
            cross_rank=peers.index(index), cross_size=len(peers), hostname=hosts[index].hostname,
            host_index=used_hosts.index(index), num_hosts=len(used_hosts),
        ))
    return assignments


@lru_cache(maxsize=1)
def _local_names() -> frozenset[str]:
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
    try:
        names.add(socket.getfqdn())
        names.update(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return frozenset(names)


def is_local_host(hostname: str) -> bool:
    """True when ``hostname`` names this machine (by name, ``localhost`` or one of its addresses)."""
    if hostname in _local_names() or hostname.startswith("127."):
        return True
    try:
        return socket.gethostbyname(hostname) in _local_names() | {"127.0.0.1"}
    except OSError:
        return False
