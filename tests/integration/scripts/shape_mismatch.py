"""Rank 1 allreduces a tensor of another shape: every rank must get a RuntimeError, then carry on."""

import time

import torch

import torchring as hvd

hvd.init()
started = time.monotonic()
try:
    hvd.allreduce(torch.ones(4 if hvd.rank() != 1 else 6), name="grad.fc1")
    print("NO ERROR")
except RuntimeError as error:
    print(f"error after {time.monotonic() - started:.2f}s: {error}")
result = hvd.allreduce(torch.ones(4), name="grad.fc1.next", op=hvd.Sum)
print(f"next allreduce: {result.tolist()}")
