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
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from torchring.runtime import group_reaper
from torchring.runtime.dataplane.data_groups import DataGroups
from torchring.runtime.startup import gloo_group


def peer(port: int, timeout: timedelta, rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    gloo_group(store, rank, 2, timeout, lazy=True)  # posts its address, connects nothing
    os.kill(os.getpid(), signal.SIGKILL)


def main(mode: str, timeout: timedelta, rank: int) -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
    child = subprocess.Popen([sys.executable, __file__, "peer", str(timeout.total_seconds()), str(1 - rank),
                              str(store.port)])
    group = gloo_group(store, rank, 2, timeout, lazy=True)
    assert child.wait() == -signal.SIGKILL
    work = group.allreduce([torch.ones(4)])  # its pair connects to the dead peer, for up to 5 x timeout
    holder: dict[str, object] = {"group": group}
    holder["self"] = holder
    started = time.monotonic()
    DataGroups(group).shutdown()
    del group
    retired = time.monotonic()
    del holder
    gc.collect()
    collected = time.monotonic()
    result = {"retire_s": retired - started, "collect_s": collected - retired}
    if mode == "wait":
        result["settled"] = group_reaper.settle(10 * timeout.total_seconds())
        result["settle_s"] = time.monotonic() - collected
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
