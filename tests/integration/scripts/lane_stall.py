"""DistributedOptimizer on its bucket lane; then rank 1 comes ``LANE_DELAY`` seconds late to a step
(rank 0 must warn, or give up) and, with ``LANE_DIE=1``, exits before the step after it (the job must
fail with its exit code)."""

import os
import sys
import time

import torch
from torch import nn

import torchring as hvd

hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())


def step() -> None:
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()


for _ in range(3):
    step()
assert optimizer._lane is not None


def step_or_exit() -> None:
    try:
        step()
    except hvd.HorovodInternalError as error:
        print(f"internal error: {error}", flush=True)
        sys.stdout.flush()
        os._exit(5)


if hvd.rank() == 1:
    time.sleep(float(os.environ["LANE_DELAY"]))
step_or_exit()
print("stepped", flush=True)
if os.environ.get("LANE_DIE") == "1":
    if hvd.rank() == 1:
        os._exit(3)
    step_or_exit()
hvd.shutdown()
