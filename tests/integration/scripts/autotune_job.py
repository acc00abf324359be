"""Trains a small model with ``DistributedOptimizer`` under the autotuner (flags set by the test's
horovodrun command line), then re-initialises and trains again (the autotuner starts a new search), then
rank 1 joins while rank 0 trains on (a joined rank: nothing changes), then both train again after the join
(their step counts differ by then; tuning must still go on alike). Each rank writes, to
``<prefix>.<rank>.json``: the values the autotuner applied and after which step, the engine's fusion
threshold and cycle time after every step of each phase, and a digest of the weights before the join."""

from __future__ import annotations

import json
import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from torchring.runtime import context

PHASE_STEPS = 80


def main(prefix: str) -> None:
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(hvd.rank())
    data, target = torch.randn(32, 64, generator=generator), torch.randint(0, 10, (32,), generator=generator)
    engine_values: dict[str, list] = {}

    def train(phase: str, steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(model(data), target).backward()
            optimizer.step()
            settings = context.current().engine.settings
            engine_values.setdefault(phase, []).append((settings.fusion_threshold, round(settings.cycle_time_s * 1e6)))

    train("first", PHASE_STEPS)
    hvd.shutdown()
    hvd.init()  # as an elastic reset does: the autotuner tunes again
    train("reinitialised", PHASE_STEPS)
    digest = float(sum(p.detach().double().sum() for p in model.parameters()))
    rank = hvd.rank()
    if rank != 1:
        train("rank 1 joined", PHASE_STEPS // 2)  # rank 0 takes more steps than rank 1
    hvd.join()
    train("after the join", PHASE_STEPS)  # tuning goes on, on every rank alike
    tuner = optimizer._autotuner
    with open(f"{prefix}.{rank}.json", "w") as handle:
        json.dump({"history": tuner.history, "engine": engine_values, "digest": digest,
                   "buckets": [len(b.params) for b in optimizer._buckets]}, handle)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
