"""A torchring Gloo group (pairs connected on first use) whose peer died before they connected: rank 0
starts an allreduce (its worker thread now tries to connect until five times the group timeout), keeps a
reference to the group in a reference cycle (as an exception's traceback does), retires the group the
way ``shutdown()`` does, then lets a garbage collection free the cycle. Prints one JSON line with how
long each step blocked; then, with ``wait``, how long until the reaper destroyed the group, or, with
``exit``, nothing more: the process exits while the group's thread still waits for the dead peer.

Usage: retired_group_dead_peer.py wait|exit GROUP_TIMEOUT_S RANK (the survivor's rank, 0 or 1; it starts
the other rank itself)."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from torchring.runtime.dataplane import group_reaper
from torchring.runtime.dataplane.data_groups import DataGroups
from torchring.runtime.startup import gloo_group


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def keep_for_good(value: object) -> None:
    """Refer to ``value`` from a daemon thread's frame, which the interpreter never frees. A tensor whose
    Python object was freed while a collective still holds it needs the interpreter lock when the collective
    lets go of it, and a thread that asks for the lock while the interpreter finalizes aborts the process
    ("terminate called without an active exception"): when the connection attempts to the dead peer ran
    out during the exit, 1 of 8 exits under load aborted so, 0 of 10 with the tensor kept. That race is
    not what this script tests (docs/troubleshooting.md)."""
    threading.Thread(target=lambda kept: threading.Event().wait(), args=(value,), daemon=True).start()


def peer(port: int, timeout: timedelta, rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    gloo_group(store, rank, 2, timeout, lazy=True)  # posts its address, connects nothing
    os.kill(os.getpid(), signal.SIGKILL)


def main(mode: str, timeout: timedelta, rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    child = subprocess.Popen([sys.executable, __file__, "peer", str(timeout.total_seconds()), str(1 - rank),
                              str(store.port)])
    before = threads()
    group = gloo_group(store, rank, 2, timeout, lazy=True)
    assert child.wait() == -signal.SIGKILL
    tensors = [torch.ones(4)]
    keep_for_good(tensors)
    work = group.allreduce(tensors)  # its pair connects to the dead peer: waits 5 x timeout
    holder: dict[str, object] = {"group": group}
    holder["self"] = holder
    started = time.monotonic()
    DataGroups(group).shutdown()
    del group
    retired = time.monotonic()
    del holder
    gc.collect()
    collected = time.monotonic()
    result = {"retire_s": retired - started, "collect_s": collected - retired, "threads_retired": threads() - before}
    if mode == "wait":
        result["settled"] = group_reaper.settle(10 * timeout.total_seconds())
        result["settle_s"] = time.monotonic() - collected
        result["threads_after"] = threads() - before
        try:
            work.wait()
        except RuntimeError as error:
            result["work_error"] = str(error)[:200]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    given, rank = timedelta(seconds=float(sys.argv[2])), int(sys.argv[3])
    if sys.argv[1] == "peer":
        peer(int(sys.argv[4]), given, rank)
    else:
        main(sys.argv[1], given, rank)
