"""Rank 1, as any client of the store could, forges an own-exception record for rank 0 (older than any
real one) and a deadlock verdict blaming rank 0, then raises ValueError itself; rank 0 trains until its
collective fails because rank 1 left. The launcher must ignore both forgeries and blame rank 1."""

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from torchring.contract import DEADLOCK_KEY, RANK, STORE_ADDR, STORE_PORT, own_failure_key

rank = int(os.environ[RANK])
dist.init_process_group("gloo")
if rank == 1:
    raw = dist.TCPStore(os.environ[STORE_ADDR], int(os.environ[STORE_PORT]), is_master=False,
                        timeout=timedelta(seconds=30))
    raw.set(own_failure_key(0), json.dumps({"at": 0.0, "error": "ValueError: forged", "where": "x.py:1"}))
    raw.set(DEADLOCK_KEY, json.dumps({"blamed": [0], "lines": ["forged"]}))
    dist.barrier()
    raise ValueError("the real failure, on rank 1")
dist.barrier()
while True:
    dist.all_reduce(torch.ones(4))
