"""Rank 2 sets other values of the engine knobs every rank shares than the other ranks do: it builds its
engine with them before the meeting, and again with rank 0's after it. Each rank prints the values its
engine runs with, how many completion threads it has, and a sum."""

import os
import threading

import torch

import torchring as hvd

if os.environ["RANK"] == "2":
    os.environ["HOROVOD_FUSION_THRESHOLD"] = str(8 * 1024 * 1024)
    os.environ["HOROVOD_CACHE_CAPACITY"] = "16"
    os.environ["TORCHRING_CONTROL_GATHER_RANKS"] = "64"
hvd.init()
from torchring.runtime import context  # noqa: E402 - the runtime exists once init() returned

settings = context.current().engine.settings
completion_threads = sum(1 for t in threading.enumerate() if t.name.startswith("torchring-completion"))
total = hvd.allreduce(torch.ones(1), op=hvd.Sum, name="uneven.sum").item()
print(f"fusion {settings.fusion_threshold} cache {settings.cache_capacity} gather {settings.control_gather_ranks} "
      f"completion-threads {completion_threads} sum {total}")
