"""A training loop in which one rank goes wrong mid-training.

``fault_in_training.py MODE FAULT [RANK] [STEP]``: MODE is ``optimizer`` (``hvd.DistributedOptimizer``),
``allreduce`` (``hvd.allreduce`` of the loss only) or ``ddp`` (plain ``DistributedDataParallel``, no
torchring import). At step STEP (default 20) rank RANK (default 1) does FAULT: ``raise`` (a
``ValueError``), ``sleep`` (prints ``sleeping`` and sleeps 600 s before the step), or ``pid`` (prints
``training rank=R pid=P`` and trains on slowly, for a test to SIGSTOP it). The launcher must name that
rank, whichever rank exits first.
"""

import os
import sys
import time

import torch

MODE, FAULT = sys.argv[1], sys.argv[2]
FAILING_RANK = int(sys.argv[3]) if len(sys.argv) > 3 else 1
FAILING_STEP = int(sys.argv[4]) if len(sys.argv) > 4 else 20


def batches(rank: int):
    generator = torch.Generator().manual_seed(rank)
    while True:
        yield torch.randn(16, 32, generator=generator), torch.randint(0, 4, (16,), generator=generator)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def train(step_fn, rank: int) -> None:
    for step, (x, y) in enumerate(batches(rank)):
        if rank == FAILING_RANK and step == FAILING_STEP:
            if FAULT == "raise":
                raise ValueError(f"bad batch at step {step} on rank {rank}")
            if FAULT == "sleep":
                print("sleeping", flush=True)
                time.sleep(600)
            if FAULT == "pid":
                print(f"training rank={rank} pid={os.getpid()}", flush=True)
        if FAULT == "pid" and step > FAILING_STEP:
            time.sleep(0.02)
        step_fn(x, y)


if MODE == "ddp":
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    net = DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

    def ddp_step(x, y):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()

    train(ddp_step, dist.get_rank())
else:
    import torchring as hvd

    hvd.init()
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    if MODE == "optimizer":
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=net.named_parameters())

    def hvd_step(x, y):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        if MODE == "allreduce":
            hvd.allreduce(loss.detach(), name="loss")

    train(hvd_step, hvd.rank())
