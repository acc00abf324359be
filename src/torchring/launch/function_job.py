"""``torchring.run(fn, ...)``: run a Python function on every rank of a job and return its results.

The function and its arguments are pickled with cloudpickle (so functions defined in ``__main__``,
lambdas and closures work) and handed to the ranks through the job's rendezvous store; each rank runs
``python -m torchring.launch.function_rank``, calls the function and puts its pickled result back in
the store, where the launcher collects them in rank order. Both are signed with the job's secret
(``store_auth``): only bytes the job itself wrote reach ``cloudpickle.loads``, in a rank and in the
launcher alike; anything else fails the job with an error that says so.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle
import torch.distributed as dist

from ..contract import FUNCTION_KEY, STORE_ADDR, STORE_PORT, function_result_key
from ..store_auth import AuthenticatedStore, require_credentials
from .hosts import HostSlots, parse_hostfile, parse_hosts
from .job import RunConfig, run_job
from .spawn.ssh import SshOptions
from .spawn.worker import Worker
from .supervisor import Failure


class FunctionJobError(RuntimeError):
    """The job running the function failed: ``rank`` is the rank that caused it (None when no one rank
    did), ``error`` the last line it wrote to stderr (typically its exception), ``exit_code`` the job's."""

    def __init__(self, message: str, exit_code: int, rank: int | None = None, error: str = "") -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.rank = rank
        self.error = error


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
        np: int | None = None, hosts: str | None = None, hostfile: str | None = None, *,
        num_proc: int | None = None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
        start_timeout: float = 30.0, network_interface: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None, output_filename: str | None = None, verbose: bool = False,
        executable: str | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``np`` ranks (on ``hosts``, e.g. ``"a:2,b:2"``, or this host) and
    return the list of results in rank order. The function typically calls ``hvd.init()`` itself.

    Raises ``FunctionJobError`` when a rank fails (its traceback is in the job's output)."""
    size = np if np is not None else num_proc
    if size is None or size < 1:
        raise ValueError("torchring.run: give the number of ranks, np=N")
    host_slots: list[HostSlots] = (parse_hostfile(hostfile) if hostfile else parse_hosts(hosts) if hosts
                                   else [HostSlots("localhost", size)])
    interfaces = (network_interface,) if isinstance(network_interface, str) else tuple(network_interface or ())
    python = executable or sys.executable
    config = RunConfig(
        num_proc=size, hosts=host_slots, command=[python, "-m", "torchring.launch.function_rank"],
        verbose=verbose, ssh=SshOptions(port=ssh_port, identity_file=ssh_identity_file,
                                        connect_timeout_s=start_timeout, python=python),
        network_interfaces=interfaces, output_dir=output_filename, extra_env=dict(env or {}),
    )
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    results: dict[int, Any] = {}

    forged: list[int] = []

    def give(store: AuthenticatedStore) -> None:
        store.set(FUNCTION_KEY, payload)

    def collect(store: AuthenticatedStore) -> None:
        for rank in range(size):
            value = store.get(function_result_key(rank), max_bytes=0)
            if value is not None:
                results[rank] = cloudpickle.loads(value)
            elif function_result_key(rank) in store.rejected:
                forged.append(rank)

    failed: list[tuple[int | None, str]] = []

    def note_failure(failure: Failure, workers: Sequence[Worker]) -> None:
        tail = next((w.stderr_tail for w in workers if w.rank == failure.rank), [])
        failed.append((failure.rank, tail[-1].strip() if tail else failure.reason))

    code = run_job(config, with_store=give, after_job=collect, on_failure=note_failure)
    if code != 0:
        rank, error = failed[0] if failed else (None, "")
        who = f"rank {rank} failed: {error}" if rank is not None else "the job failed"
        raise FunctionJobError(f"torchring.run: {who} (exit code {code}; the job's output above has the whole "
                               "story)", code, rank, error)
    if forged:
        raise FunctionJobError(f"torchring.run: the result of rank(s) {forged} in the job's store was not written by "
                               "the job (it is not signed with the job's secret); another process reached the "
                               "store's port and replaced it, so it was not unpickled", 1)
    missing = [rank for rank in range(size) if rank not in results]
    if missing:
        raise FunctionJobError(f"torchring.run: rank(s) {missing} ended without a result", 1)
    return [results[rank] for rank in range(size)]


def _environment_store() -> AuthenticatedStore:
    """In a rank of ``torchring.run``: the job's store, signed with the job's secret (which must exist)."""
    from datetime import timedelta

    credentials = require_credentials("torchring.run's function payload")
    return AuthenticatedStore(dist.TCPStore(os.environ[STORE_ADDR], int(os.environ[STORE_PORT]),
                                            is_master=False, timeout=timedelta(seconds=60)), credentials)
