"""Rank 1 forges its own peer-failure record (as any client of the store could) and fails on its own
(exit 3); rank 0 records a real, signed peer failure and fails (exit 5) once rank 1 is gone."""

import os
import time
from datetime import timedelta

import torch.distributed as dist

from torchring.contract import RANK, STORE_ADDR, STORE_PORT, peer_failure_key
from torchring.store_auth import AuthenticatedStore, job_credentials

rank = int(os.environ[RANK])
credentials = job_credentials()
raw = dist.TCPStore(os.environ[STORE_ADDR], int(os.environ[STORE_PORT]), is_master=False,
                    timeout=timedelta(seconds=30))
if rank == 1:
    raw.set(peer_failure_key(1), "rank 0 went away (forged)")
    raw.set("test/pid/1", str(os.getpid()))
    raise SystemExit(3)
AuthenticatedStore(raw, credentials).set(peer_failure_key(0), "rank 1 went away")
raw.wait(["test/pid/1"])
pid = int(raw.get("test/pid/1"))
while os.path.exists(f"/proc/{pid}") and "State:\tZ" not in open(f"/proc/{pid}/status").read():
    time.sleep(0.02)
raise SystemExit(5)
