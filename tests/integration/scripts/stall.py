"""Rank 1 submits its allreduce 3 s after rank 0: rank 0 must warn about the stall, then both finish."""

import time

import torch

import torchring as hvd

hvd.init()
if hvd.rank() == 1:
    time.sleep(3)
result = hvd.allreduce(torch.ones(2), name="late.tensor", op=hvd.Sum)
print(f"result {result.tolist()}")
