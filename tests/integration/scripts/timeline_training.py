"""A few training steps with DistributedOptimizer; with KILL_RANK0_AFTER set, rank 0 SIGKILLs itself."""

import os
import signal

import torch

import torchring as hvd

hvd.init()
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
kill_after = int(os.environ.get("KILL_RANK0_AFTER", "-1"))
for step in range(6):
    if step == kill_after and hvd.rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
hvd.grouped_allreduce([torch.ones(3), torch.ones(5)], name="fused.pair")  # released together: one fused buffer
print("trained")
