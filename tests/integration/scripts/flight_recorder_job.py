"""Ranks that record their collectives in ``<dir>/ops.<rank>`` (``TORCHRING_FLIGHT_RECORD``, set here before
``hvd.init()`` until the launcher sets it). ``FLIGHT_MODE=steps``: 30 DistributedOptimizer steps in which
rank 1 works ``SLOW_S`` longer than rank 0. ``FLIGHT_MODE=pending``: rank 0 submits allreduce 'x', rank
1 submits it only once the file ``<dir>/release`` exists; both then finish."""

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

directory = Path(sys.argv[1])
os.environ["TORCHRING_FLIGHT_RECORD"] = str(directory / f"ops.{os.environ['TORCHRING_RANK']}")

import torchring as hvd  # noqa: E402 - the variable must be set before init(), which reads it

hvd.init()
assert "TORCHRING_FLIGHT_RECORD" not in os.environ, "the recorder leaves the variable to this process alone"
mode = os.environ["FLIGHT_MODE"]
if mode == "steps":
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    slow_s = float(os.environ["SLOW_S"]) if hvd.rank() == 1 else 0.0
    for _ in range(30):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        time.sleep(0.005 + slow_s)  # the rest of a step's work; rank 1's takes longer
        optimizer.step()
elif mode == "pending":
    release = directory / "release"
    if hvd.rank() == 0:
        handle = hvd.allreduce_async(torch.ones(2), name="x", op=hvd.Sum)
    while not release.exists():  # the test creates it once it has seen rank 0's pending 'x'
        time.sleep(0.05)
    if hvd.rank() == 1:
        handle = hvd.allreduce_async(torch.ones(2), name="x", op=hvd.Sum)
    print(f"x {hvd.synchronize(handle).tolist()}", flush=True)
hvd.shutdown()
