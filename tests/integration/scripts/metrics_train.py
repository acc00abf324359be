"""Trains a small model in 50 ms steps (the same number on every rank), counting samples through
``torchring.progress``; prints "ready" after the first steps. Stops once the file ``METRICS_STOP_FILE``
exists (the ranks agree on it through an allreduce, so they stop at the same step), or after
``METRICS_SECONDS`` seconds' worth of steps."""

import os
import sys
import time

import torch

import torchring as hvd

hvd.init()
model = torch.nn.Linear(16, 4)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
total_steps = int(float(os.environ.get("METRICS_SECONDS", "60")) / 0.05)
stop_file = os.environ.get("METRICS_STOP_FILE")
steps = 0
with hvd.progress(desc="train", batch_size=8, total=total_steps) as bar:
    while steps < total_steps:
        optimizer.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        stop = float(stop_file is not None and os.path.exists(stop_file))
        # a negotiated reduction too; its maximum says whether any rank saw the stop file
        if hvd.allreduce(torch.full((4,), stop), name="metric", op=hvd.Max)[0] > 0:
            break
        bar.update()
        steps += 1
        if steps == 5:
            print("ready", flush=True)
        time.sleep(0.05)
hvd.shutdown()
# torch 2.13 can abort at interpreter exit after Gloo collectives, even after an orderly shutdown
# ("terminate called without an active exception": once in 13 runs of this test here); this
# test is about the metrics, so leave without running the finalizers.
sys.stdout.flush()
os._exit(0)
