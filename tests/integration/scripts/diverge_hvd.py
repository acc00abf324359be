"""Ranks that diverge: they wait for collectives the others never submit.

``diverge_hvd.py extra``: every rank allreduces 'grad' each step; at step 5 rank 1 alone first
allreduces 'extra'. ``diverge_hvd.py reducescatter``: as in Horovod's test_torch.py at 3 ranks, ranks
0 and 2 go on to a barrier while rank 1 calls one more unnamed reducescatter. ``diverge_hvd.py
optimizer``: a DistributedOptimizer loop in which rank 1 alone allreduces its loss at step 5, while
rank 0 goes on to the next step and waits in its gradient lane.
"""

import sys

import horovod.torch as hvd
import torch

hvd.init()
if sys.argv[1] == "extra":
    for step in range(1000):
        if step == 5 and hvd.rank() == 1:
            print("diverging", flush=True)
            hvd.allreduce(torch.ones(4), name="extra")
        hvd.allreduce(torch.ones(4), name="grad")
elif sys.argv[1] == "optimizer":
    model = torch.nn.Linear(8, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    for step in range(1000):
        optimizer.zero_grad()
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
        optimizer.step()
        if step == 5 and hvd.rank() == 1:
            print("diverging", flush=True)
            hvd.allreduce(loss.detach(), name="loss")
else:
    for _ in range(3):
        hvd.reducescatter(torch.ones(6, 2))
    if hvd.rank() == 1:
        print("diverging", flush=True)
        hvd.reducescatter(torch.ones(6, 2))
    hvd.barrier()
print("not reached", flush=True)
