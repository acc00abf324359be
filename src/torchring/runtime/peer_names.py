"""Naming the host and ranks behind an address in a collective's error.

Gloo reports a lost peer by address only (``Read error [10.78.0.3]:56498: Connection reset by peer``).
Under a scheduler (``srun``, ``mpirun``) no launcher is there to say which rank that was, so rank 0
writes the job's host table to the store once, at the meeting (every rank's host name, in rank order),
and a failing rank reads it, resolves the names and appends ``10.78.0.3 is h2 (ranks 2, 3)`` to its
error. Everything is bounded: a store or a name service that no longer answers adds nothing.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Sequence

from ..store_auth import AuthenticatedStore

__all__ = ["decode_host_table", "encode_host_table", "host_table_key", "name_addresses"]

#: How long naming may take in all (store read and name resolution).
NAMING_TIMEOUT_S = 3.0
#: The longest host table read back (100,000 ranks of long names).
_MAX_TABLE_BYTES = 16 << 20
_ADDRESS = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")


def host_table_key(prefix: str) -> str:
    """Where rank 0 writes the host table of generation ``prefix``."""
    return f"{prefix}/hosts"


def encode_host_table(hostnames: Sequence[str]) -> str:
    """Every rank's host name, each distinct name once: ``{"hosts": [...], "of": [index per rank]}``."""
    distinct = list(dict.fromkeys(hostnames))
    index = {name: position for position, name in enumerate(distinct)}
    return json.dumps({"hosts": distinct, "of": [index[name] for name in hostnames]})


def decode_host_table(text: str | bytes) -> dict[str, list[int]]:
    """Host name -> its ranks; ``ValueError`` when ``text`` is not a host table."""
    data = json.loads(text)
    hosts, of = data["hosts"], data["of"]
    if not isinstance(hosts, list) or not isinstance(of, list):
        raise ValueError("not a host table")
    ranks: dict[str, list[int]] = {str(name): [] for name in hosts}
    for rank, position in enumerate(of):
        ranks[str(hosts[position])].append(rank)
    return ranks


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


def _resolve(hosts: list[str]) -> dict[str, str]:
    """Address -> host name for every name that resolves (IPv4)."""
    found: dict[str, str] = {}
    for host in hosts:
        try:
            for info in socket.getaddrinfo(host, None, socket.AF_INET):
                found.setdefault(str(info[4][0]), host)
        except OSError:
            continue
    return found


def _naming(text: str, store: AuthenticatedStore, prefix: str) -> str:
    addresses = list(dict.fromkeys(_ADDRESS.findall(text)))
    if not addresses:
        return ""
    raw = store.get(host_table_key(prefix), max_bytes=_MAX_TABLE_BYTES)
    if raw is None:
        return ""
    ranks_of = decode_host_table(raw)
    hosts_at = _resolve(list(ranks_of))
    named = [_name(address, hosts_at[address], ranks_of[hosts_at[address]]) for address in addresses
             if address in hosts_at]
    return "; ".join(named)


def _name(address: str, host: str, ranks: list[int]) -> str:
    """``10.78.0.3 is h2 (ranks 2, 3)``, or ``10.78.0.3 holds ranks 2, 3`` where the host is its address."""
    if host == address:
        return f"{address} holds {_ranks_text(ranks)}"
    return f"{address} is {host} ({_ranks_text(ranks)})"


def name_addresses(text: str, store: AuthenticatedStore, prefix: str, timeout_s: float = NAMING_TIMEOUT_S) -> str:
    """``10.78.0.3 is h2 (ranks 2, 3)`` for each IPv4 address in ``text`` that is one of the job's hosts;
    "" when none is, or when the answer does not come within ``timeout_s``."""
    result: list[str] = []

    def work() -> None:
        try:
            result.append(_naming(text, store, prefix))
        except Exception:  # noqa: BLE001 - naming is a courtesy: a failure adds nothing to the error
            pass

    thread = threading.Thread(target=work, name="torchring-peer-names", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return result[0] if result else ""
