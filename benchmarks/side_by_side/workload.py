"""One workload, run unchanged under torchring or the real Horovod, each under its own launcher.

    torchring run -np 2 python benchmarks/side_by_side/workload.py burst
    HOROVOD_API=1 horovodrun --gloo -np 2 -H localhost:2 python benchmarks/side_by_side/workload.py burst

Workloads (rank 0 prints one line; ``ROUNDS`` sets how many timed rounds, medians are reported):

* ``burst``: 200 × 4 KB ``allreduce_async_`` then ``synchronize`` each, after a barrier;
* ``latency``: one blocking 4 KB and one 800 KB ``allreduce_``, and 10 blocking 4 KB ones in a row;
* ``mlp``, ``convnet``: ``DistributedOptimizer`` training on synthetic data, batch 64 per rank
  (the models of ``torchring bench train``), images per second over rounds of 30 batches.

``run.sh`` beside this file alternates the two frameworks. Horovod must be importable in the Python
that runs it (``shared/peers/build_horovod.sh`` builds it); torchring only needs its sources on
``PYTHONPATH`` there, for the models.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

if os.environ.get("HOROVOD_API"):
    import horovod.torch as hvd
    FRAMEWORK = "horovod"
else:
    import torchring as hvd
    FRAMEWORK = "torchring"


def timed_ms(run: Callable[[], Any], rounds: int, warmup: int = 20) -> float:
    """Median milliseconds of ``run`` over ``rounds``, each after a barrier."""
    for _ in range(warmup):
        hvd.barrier()
        run()
    samples = []
    for _ in range(rounds):
        hvd.barrier()
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000.0


def burst(rounds: int) -> str:
    from torchring.bench.collectives import BURST_BYTES, BURST_COUNT, async_burst

    tensors = [torch.ones(BURST_BYTES // 4) for _ in range(BURST_COUNT)]
    elapsed = timed_ms(lambda: async_burst(hvd, tensors, hvd.Sum), rounds)
    return f"{BURST_COUNT} x 4 KB allreduce_async_ + synchronize: {elapsed:.2f} ms"


def latency(rounds: int) -> str:
    small, large = torch.ones(1024), torch.ones(200 * 1024)
    lone_small = timed_ms(lambda: hvd.allreduce_(small, name="small", op=hvd.Sum), rounds)
    lone_large = timed_ms(lambda: hvd.allreduce_(large, name="large", op=hvd.Sum), rounds)
    ten = timed_ms(lambda: [hvd.allreduce_(small, name="small", op=hvd.Sum) for _ in range(10)], rounds)
    return f"blocking allreduce_: 4 KB {lone_small:.2f} ms, 800 KB {lone_large:.2f} ms, 10 x 4 KB {ten:.2f} ms"


def train(model_name: str, rounds: int) -> str:
    from torchring.bench.models import build_model, input_shape

    torch.manual_seed(42)
    model = build_model(model_name)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    inputs, labels = torch.randn(64, *input_shape(model_name)), torch.randint(0, 10, (64,))

    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()

    for _ in range(10):
        step()
    rates = []
    for _ in range(rounds):
        hvd.barrier()
        started = time.perf_counter()
        for _ in range(30):
            step()
        rates.append(30 * 64 * hvd.size() / (time.perf_counter() - started))
    return f"{model_name} DistributedOptimizer: {statistics.median(rates):.0f} img/s"


def main() -> None:
    workload = sys.argv[1] if len(sys.argv) > 1 else "burst"
    torch.set_num_threads(1)
    hvd.init()
    if workload in ("burst", "latency"):
        line = (burst if workload == "burst" else latency)(int(os.environ.get("ROUNDS", "200")))
    else:
        line = train(workload, int(os.environ.get("ROUNDS", "5")))
    if hvd.rank() == 0:
        print(f"{FRAMEWORK}: {line}", flush=True)
    hvd.shutdown()
    os._exit(0)  # no interpreter teardown racing the backends' threads


if __name__ == "__main__":
    main()
