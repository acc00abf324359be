"""Trains a small model for about ``METRICS_SECONDS`` seconds (the same number of 50 ms steps on every
rank), counting samples through ``torchring.progress``; prints "ready" after the first steps."""

import os
import time

import torch

import torchring as hvd

hvd.init()
model = torch.nn.Linear(16, 4)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
total_steps = int(float(os.environ.get("METRICS_SECONDS", "8")) / 0.05)
steps = 0
with hvd.progress(desc="train", batch_size=8, total=total_steps) as bar:
    while steps < total_steps:
        optimizer.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        hvd.allreduce(torch.ones(4), name="metric")  # a negotiated reduction too
        bar.update()
        steps += 1
        if steps == 5:
            print("ready", flush=True)
        time.sleep(0.05)
hvd.shutdown()
