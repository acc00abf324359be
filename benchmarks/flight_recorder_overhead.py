"""What the flight recorder (``TORCHRING_FLIGHT_RECORD``) costs: rounds with it on and off alternate in one job,
so both share the machine's noise; rank 0 prints the median throughput of each and their ratio.

    torchring run -np 2 python benchmarks/flight_recorder_overhead.py train 20 150   # DistributedOptimizer, mlp
    torchring run -np 2 python benchmarks/flight_recorder_overhead.py tiny 20 100    # 20 small engine allreduces

Arguments: mode, rounds, timed steps per round. Each rank writes ``$TMPDIR/torchring-ops-bench.<rank>``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import torchring as hvd
from torchring.bench.models import build_model
from torchring.contract import FLIGHT_RECORD_FILE
from torchring.runtime.observe import flight_recorder


def make_step(mode: str) -> Callable[[], None]:
    torch.manual_seed(0)
    if mode == "train":
        model = build_model("mlp")
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                             named_parameters=model.named_parameters())
        data, target = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))

        def train_step() -> None:
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()

        return train_step
    tensor = torch.ones(16)

    def tiny_step() -> None:
        handles = [hvd.allreduce_async(tensor, name=f"t{i}") for i in range(20)]
        for handle in handles:
            hvd.synchronize(handle)

    return tiny_step


def timed_round(mode: str, steps: int, recording: bool, rank: int) -> float:
    """Steps per second of one round, in a fresh ``init()`` with the recorder on or off."""
    flight_recorder._claimed_path = None  # an earlier init() with the recorder on must not carry over
    if recording:
        os.environ[FLIGHT_RECORD_FILE] = os.path.join(tempfile.gettempdir(), f"torchring-ops-bench.{rank}")
    hvd.init()
    try:
        step = make_step(mode)
        for _ in range(20):
            step()
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        hvd.barrier()
        return steps / (time.perf_counter() - start)
    finally:
        hvd.shutdown()


def main() -> None:
    mode, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    rank = int(os.environ.get("TORCHRING_RANK", "0"))
    rates: dict[bool, list[float]] = {True: [], False: []}
    for index in range(rounds):
        for recording in (True, False) if index % 2 == 0 else (False, True):
            rates[recording].append(timed_round(mode, steps, recording, rank))
    if rank == 0:
        on, off = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"{mode}: recorder off {off:.1f} steps/s, on {on:.1f} steps/s (medians of {rounds} rounds), "
              f"on/off {on / off:.4f}")


if __name__ == "__main__":
    main()
