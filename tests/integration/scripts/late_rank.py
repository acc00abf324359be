"""Rank 1 calls hvd.init() LATE_RANK_DELAY seconds after rank 0."""

import os
import time

import torch

import torchring as hvd

if os.environ["RANK"] == "1":
    time.sleep(float(os.environ["LATE_RANK_DELAY"]))
hvd.init()
print(f"sum {hvd.allreduce(torch.ones(1), op=hvd.Sum).item()}")
