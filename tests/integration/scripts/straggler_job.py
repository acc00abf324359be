"""DistributedOptimizer steps until the file ``argv[1]`` exists (rank 0 looks every 25 steps); rank 1's
work per step takes 25 ms longer than rank 0's, so the launcher's straggler watch names it."""

import sys
import time
from pathlib import Path

import torch
from torch import nn

import torchring as hvd

stop = Path(sys.argv[1])
hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
extra = 0.025 if hvd.rank() == 1 else 0.0
step = 0
# asked every 25 steps only: a collective in every step would absorb rank 0's wait before the reduction
while step % 25 or not hvd.broadcast_object(stop.exists(), root_rank=0, name="stop"):
    step += 1
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    time.sleep(0.005 + extra)  # the rest of a step's work; rank 1's takes longer
    optimizer.step()
print(f"done rank={hvd.rank()}", flush=True)
hvd.shutdown()
