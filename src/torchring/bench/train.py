"""The training benchmark, on every rank: the same model trained on synthetic data by several
frameworks in alternating rounds, so that they share the machine's noise.

Each framework has its own copy of the model and its own optimizer (SGD, lr 0.01, momentum 0.9,
cross-entropy). A round runs each framework in turn (the order rotates every round): warm-up
batches, a barrier, then timed batches. Throughput is job-wide: ``batch_size × ranks × batches``
over the slowest rank's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchring

from ..optim.autotune import (
    CONFIRM_PAIRS,
    SETTLE_STEPS,
    Autotuner,
    apply_engine_values,
    autotune_start_values,
    describe,
    enable_autotune,
)
from ..runtime import context
from .horovod_peer import everyone_agrees, load_horovod
from .models import NUM_CLASSES, build_model, input_shape
from .options import TrainOptions
from .stats import Summary

Step = Callable[[], None]
#: The name the autotuned torchring optimizer has in the results.
AUTOTUNED = "torchring+autotune"


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, target: torch.Tensor) -> Step:
    def step() -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    return step


def torchring_step(model_name: str, data: torch.Tensor, target: torch.Tensor) -> Step:
    """torchring: parameters broadcast from rank 0, gradients averaged by ``DistributedOptimizer``."""
    model = build_model(model_name)
    torchring.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torchring.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters())
    return _step(model, optimizer, data, target)


def autotuned_step(model_name: str, data: torch.Tensor, target: torch.Tensor) -> tuple[Step, Autotuner]:
    """torchring with its autotuner on this optimizer (``optim.autotune``)."""
    model = build_model(model_name)
    torchring.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torchring.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters())
    return _step(model, optimizer, data, target), enable_autotune(optimizer)


def tune(step: Step, tuner: Autotuner) -> dict[str, Any]:
    """Train until the autotuner's search is over (the same number of steps on every rank: warm-up, search,
    the confirmation of its pick and one more sample); what it chose and what it took."""
    config = tuner.config
    samples = config.warmup_samples + config.max_samples + 2 * CONFIRM_PAIRS + 1
    steps = samples * (config.steps_per_sample + SETTLE_STEPS)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return {"values": dict(tuner.values), "steps": steps, "seconds": time.perf_counter() - started,
            "samples": config.max_samples, "warmup_samples": config.warmup_samples,
            "confirm_samples": 2 * CONFIRM_PAIRS, "steps_per_sample": config.steps_per_sample}


def ddp_step(model_name: str, data: torch.Tensor, target: torch.Tensor) -> Step:
    """``DistributedDataParallel`` on the raw gloo group."""
    model = DistributedDataParallel(build_model(model_name))
    return _step(model, _sgd(model), data, target)


def horovod_step(hvd: ModuleType, model_name: str, data: torch.Tensor, target: torch.Tensor) -> Step:
    """Horovod itself, set up as torchring is."""
    model = build_model(model_name)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters())
    return _step(model, optimizer, data, target)


def set_up(options: TrainOptions) -> tuple[dict[str, Step], dict[str, str], dict[str, Autotuner]]:
    """One training step per usable framework (in the order asked), why the others were skipped, and the
    autotuner of the autotuned one."""
    world_size = dist.get_world_size()
    generator = torch.Generator().manual_seed(options.seed + dist.get_rank())
    data = torch.randn(options.batch_size, *input_shape(options.model), generator=generator)
    target = torch.randint(0, NUM_CLASSES, (options.batch_size,), generator=generator)
    steps: dict[str, Step] = {}
    skipped: dict[str, str] = {}
    tuned: dict[str, Autotuner] = {}
    for framework in options.frameworks:
        torch.manual_seed(options.seed)  # the same initial weights for every framework
        if framework == "torchring":
            steps[framework] = torchring_step(options.model, data, target)
        elif framework == "autotune":
            steps[AUTOTUNED], tuner = autotuned_step(options.model, data, target)
            tuned[AUTOTUNED] = tuner
        elif framework == "ddp":
            steps[framework] = ddp_step(options.model, data, target)
        elif framework == "horovod":
            hvd, reason = load_horovod(world_size)
            if not everyone_agrees(hvd is not None):
                skipped[framework] = reason or "Horovod could not be used on every rank"
                continue
            assert hvd is not None
            steps[framework] = horovod_step(hvd, options.model, data, target)
        else:
            raise ValueError(f"unknown framework {framework!r}")
    return steps, skipped, tuned


def _timed_round(step: Step, options: TrainOptions) -> float:
    for _ in range(options.warmup_batches):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(options.batches_per_round):
        step()
    return time.perf_counter() - start


def run_train(options: TrainOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Alternate the frameworks for ``options.rounds`` rounds; the result rank 0 reports."""
    torch.set_num_threads(options.threads)
    world_size = dist.get_world_size()
    steps, skipped, tuned = set_up(options)
    for framework, reason in skipped.items():
        log(f"skipping {framework}: {reason}")
    defaults = autotune_start_values()
    autotune = {name: tune(steps[name], tuner) for name, tuner in tuned.items()}
    for name, found in autotune.items():
        log(f"{name}: chose {describe(found['values'])} after {found['steps']} steps ({found['seconds']:.1f} s)")
    names = list(steps)
    images = options.batch_size * world_size * options.batches_per_round
    rates: dict[str, list[float]] = {name: [] for name in names}
    engine, lanes = context.current().engine, context.current().lanes
    # torchring's CPU seconds in its rounds: engine thread, bucket lane bookkeeping, bucket lane copies
    engine_cpu = torch.zeros(3, dtype=torch.float64)
    for round_index in range(options.rounds):
        shift = round_index % len(names)
        seconds = torch.zeros(len(names), dtype=torch.float64)
        for name in names[shift:] + names[:shift]:
            if tuned and "torchring" in name:  # each torchring round runs with its own engine values
                apply_engine_values(tuned[name].values if name in tuned else defaults)
            before = torch.tensor([engine.cpu_seconds(), *lanes.cpu_seconds()], dtype=torch.float64)
            seconds[names.index(name)] = _timed_round(steps[name], options)
            if name == "torchring":
                engine_cpu += torch.tensor([engine.cpu_seconds(), *lanes.cpu_seconds()], dtype=torch.float64) - before
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        for index, name in enumerate(names):
            rates[name].append(images / seconds[index].item())
        log(f"round {round_index + 1}/{options.rounds}: "
            + ", ".join(f"{name} {rates[name][-1]:.1f} img/s" for name in names))
    dist.all_reduce(engine_cpu, op=dist.ReduceOp.MAX)
    steps_timed = options.rounds * (options.warmup_batches + options.batches_per_round)
    frameworks: dict[str, Any] = {}
    for name in names:
        entry: dict[str, Any] = {"img_per_sec": rates[name], "summary": Summary.of(rates[name]).to_dict()}
        if name == "torchring":
            entry["engine_cpu_ms_per_step"] = engine_cpu[0].item() * 1000.0 / steps_timed
            entry["lane_cpu_ms_per_step"] = engine_cpu[1].item() * 1000.0 / steps_timed
            entry["lane_copies_ms_per_step"] = engine_cpu[2].item() * 1000.0 / steps_timed
        for peer in ("torchring", "ddp", "horovod"):
            if peer in rates and (peer != "torchring" or tuned):  # vs plain torchring: with --autotune
                per_round = [mine / theirs for mine, theirs in zip(rates[name], rates[peer], strict=True)]
                entry[f"ratio_to_{peer}"] = entry["summary"]["mean"] / Summary.of(rates[peer]).mean
                entry[f"ratio_to_{peer}_per_round"] = Summary.of(per_round).to_dict()
        frameworks[name] = entry
    return {"mode": "train", "model": options.model, "batch_size": options.batch_size,
            "warmup_batches": options.warmup_batches, "batches_per_round": options.batches_per_round,
            "rounds": options.rounds, "frameworks": frameworks, "skipped": skipped, "autotune": autotune}
