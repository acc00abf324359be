"""The checks of benchmarks/gpu_check.py: value checks of torchring's collectives and DistributedOptimizer,
and two measurements (DistributedOptimizer against DDP, fusion copies against a plain copy).

Every check returns a ``Result``; value checks print one line each, ``<check>: ok`` or
``<check>: WRONG: <what>, expected <value>, got <value>``.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import torchring as hvd
from torchring.bench.models import NUM_CLASSES, ResNet50, SmallResNet
from torchring.metrics.counters import METRICS
from torchring.reduction import ReduceOp
from torchring.runtime.coordination.fusion import SEPARATE_AT_BYTES, plan_batches
from torchring.runtime.coordination.negotiation import Response
from torchring.runtime.dataplane.executor import copy_all
from torchring.runtime.requests import OpType, RequestMeta

VALUE, TARGET = "value", "target"

#: --model: name -> (constructor, classes). "small" (a quarter-width ResNet-18) keeps CPU test runs short.
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], int]] = {
    "resnet50": (ResNet50, 1000),
    "small": (SmallResNet, NUM_CLASSES),
}


@dataclass
class Result:
    check: str
    kind: str  # VALUE (ok / WRONG) or TARGET (met / missed)
    measured: str
    target: str
    verdict: str  # "ok", "WRONG", "met", "missed" or "skipped"

    def line(self) -> str:
        if self.verdict == "WRONG":
            return f"{self.check}: WRONG: {self.measured}"
        if self.kind == VALUE and self.verdict == "ok":
            return f"{self.check}: ok"
        return f"{self.check}: {self.verdict}: {self.measured} (target {self.target})"


def skipped(check: str, kind: str, target: str, why: str) -> Result:
    return Result(check, kind, why, target, "skipped")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fmt(value: float) -> str:
    return f"{value:g}"


def compare(check: str, what: str, got: torch.Tensor, expected: torch.Tensor) -> Result:
    """``ok`` when ``got`` equals ``expected`` exactly (dtype, shape, every element), else the first difference."""
    if got.dtype != expected.dtype:
        return Result(check, VALUE, f"{what}: dtype, expected {expected.dtype}, got {got.dtype}", "exact", "WRONG")
    if got.shape != expected.shape:
        return Result(check, VALUE, f"{what}: shape, expected {tuple(expected.shape)}, got {tuple(got.shape)}",
                      "exact", "WRONG")
    got_cpu, expected_cpu = got.detach().cpu(), expected.detach().cpu()
    if torch.equal(got_cpu, expected_cpu):
        return Result(check, VALUE, f"{what}: exact", "exact", "ok")
    differ = (got_cpu != expected_cpu).reshape(-1)
    index = int(differ.nonzero()[0])
    return Result(check, VALUE, f"{what} (element {index}; {int(differ.sum())} of {differ.numel()} differ), "
                  f"expected {_fmt(float(expected_cpu.reshape(-1)[index]))}, "
                  f"got {_fmt(float(got_cpu.reshape(-1)[index]))}", "exact", "WRONG")


# ---- value checks ------------------------------------------------------------------------------------------


def check_average(device: torch.device, dtype: torch.dtype, elements: int, plant: bool) -> Result:
    """Average of ``rank + 1`` over the ranks: exactly (size + 1) / 2 (exact in fp16 too for small sizes)."""
    rank, size = hvd.rank(), hvd.size()
    name = f"allreduce Average {str(dtype).removeprefix('torch.')}"
    contribution = rank + 1 + (1 if plant and rank == size - 1 else 0)  # --plant wrong-value: one rank adds 1
    tensor = torch.full((elements,), float(contribution), dtype=dtype, device=device)
    got = hvd.allreduce(tensor, op=hvd.Average, name=f"gpu_check.average.{dtype}")
    expected = torch.full((elements,), (size + 1) / 2, dtype=dtype, device=device)
    return compare(name, f"mean of rank+1 over {size} ranks", got, expected)


def check_fused_burst(device: torch.device, elements: int, count: int = 200) -> Result:
    """``count`` small Sum allreduces submitted together (the engine fuses them); tensor i is (i+1)(rank+1)
    on each rank, so a tensor that got another's data or was reduced twice shows."""
    rank, size = hvd.rank(), hvd.size()
    fused_before = METRICS.fused_buffers
    tensors = [torch.full((elements,), float((i + 1) * (rank + 1)), device=device) for i in range(count)]
    handles = [hvd.allreduce_async_(t, name=f"gpu_check.burst.{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
    results = [hvd.synchronize(handle) for handle in handles]
    fused = METRICS.fused_buffers - fused_before
    triangle = size * (size + 1) // 2
    for i, got in enumerate(results):
        expected = torch.full((elements,), float((i + 1) * triangle), device=device)
        result = compare(f"fused burst of {count}", f"tensor {i} of {count}", got, expected)
        if result.verdict != "ok":
            return result
    return Result(f"fused burst of {count}", VALUE, f"{count} tensors, {fused} fused buffers", "exact", "ok")


def check_big_allreduce(device: torch.device, megabytes: float) -> Result:
    """One large Sum allreduce of ``rank + 1``, every element checked; its time is reported."""
    rank, size = hvd.rank(), hvd.size()
    elements = int(megabytes * 2**20) // 4
    tensor = torch.full((elements,), float(rank + 1), device=device)
    synchronize(device)
    started = time.perf_counter()
    hvd.allreduce_(tensor, name="gpu_check.big", op=hvd.Sum)
    synchronize(device)
    elapsed = time.perf_counter() - started
    result = compare(f"allreduce {megabytes:g} MB", "sum of rank+1", tensor,
                     torch.full((elements,), float(size * (size + 1) // 2), device=device))
    if result.verdict == "ok":
        result.measured = f"exact, {elapsed * 1e3:.1f} ms"
    return result


def check_broadcast(device: torch.device, elements: int) -> Result:
    """Broadcast from rank 1 of ``arange + 1000 * rank``: every rank ends with rank 1's tensor."""
    if hvd.size() < 2:
        return skipped("broadcast from rank 1", VALUE, "exact", "skipped: needs 2 ranks")
    tensor = torch.arange(elements, dtype=torch.float32, device=device) + 1000.0 * hvd.rank()
    got = hvd.broadcast(tensor, root_rank=1, name="gpu_check.broadcast")
    expected = torch.arange(elements, dtype=torch.float32, device=device) + 1000.0
    return compare("broadcast from rank 1", "rank 1's tensor", got, expected)


def _gather_rows(rank: int, device: torch.device) -> torch.Tensor:
    rows = torch.arange(rank + 1, dtype=torch.float32, device=device).reshape(-1, 1)
    return (100.0 * rank + rows + torch.arange(3, dtype=torch.float32, device=device) / 10).contiguous()


def check_allgather(device: torch.device) -> Result:
    """Allgather of rank r's (r+1) x 3 rows: the rows of every rank in rank order."""
    got = hvd.allgather(_gather_rows(hvd.rank(), device), name="gpu_check.allgather")
    expected = torch.cat([_gather_rows(r, device) for r in range(hvd.size())])
    return compare("allgather, first dims 1..size", "rows of every rank in order", got, expected)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, target: torch.Tensor,
           steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()


def check_optimizer_values(device: torch.device, group: dist.ProcessGroup, model_name: str, batch_size: int,
                           image_size: int, steps: int, tolerance: float = 1e-5) -> Result:
    """The model (ResNet-50 by default) in fp32 (no autocast) for ``steps`` SGD steps, with
    torchring.DistributedOptimizer and with DDP from the same initial weights on the same per-rank data: the
    parameters identical on every rank (an allgathered checksum) and within ``tolerance`` (per tensor,
    relative to its norm) of DDP's."""
    name = "DistributedOptimizer = DDP (fp32)"
    make, classes = MODELS[model_name]
    torch.manual_seed(0)
    ours = make().to(device)
    theirs = copy.deepcopy(ours)
    generator = torch.Generator().manual_seed(1000 + hvd.rank())
    data = torch.randn(batch_size, 3, image_size, image_size, generator=generator).to(device)
    target = torch.randint(0, classes, (batch_size,), generator=generator).to(device)
    # true fp32 and deterministic kernels, so that both runs compute the same gradients from the same inputs
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9),
                                             named_parameters=ours.named_parameters())
        hvd.broadcast_parameters(ours.state_dict(), root_rank=0)
        _train(ours, optimizer, data, target, steps)
        lane = getattr(optimizer, "_lane", None) is not None
        ddp = DistributedDataParallel(theirs, device_ids=[device.index] if device.type == "cuda" else None,
                                      process_group=group)
        _train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9), data, target, steps)
        synchronize(device)
    finally:
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32,
         torch.backends.cuda.matmul.allow_tf32) = saved
    params = [p.detach() for p in ours.parameters()]
    checksum = torch.stack([p.double().sum() for p in params]).cpu().reshape(1, -1)
    everyone = hvd.allgather(checksum, name="gpu_check.checksum")
    for other in range(1, hvd.size()):
        if not torch.equal(everyone[other], everyone[0]):
            index = int((everyone[other] != everyone[0]).nonzero()[0])
            return Result(name, VALUE, f"parameters differ between ranks: checksum of parameter {index}, expected "
                          f"rank 0's {float(everyone[0, index])!r}, got rank {other}'s "
                          f"{float(everyone[other, index])!r}", "identical; <= 1e-5 of DDP", "WRONG")
    worst, worst_name = 0.0, ""
    for (param_name, param), reference in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        error = float((param.detach() - reference.detach()).norm() / reference.detach().norm().clamp_min(1e-12))
        if error > worst:
            worst, worst_name = error, param_name
    target_text = f"identical on all ranks; <= {tolerance:g} of DDP"
    if worst > tolerance:
        return Result(name, VALUE, f"parameters after {steps} steps against DDP's: {worst_name}, expected a relative "
                      f"difference <= {tolerance:g}, got {worst:.3g}", target_text, "WRONG")
    path = "engine then gradient lane" if lane else "engine (no lane opened)"
    return Result(name, VALUE, f"{steps} steps ({path}), identical on all ranks, max relative difference to DDP "
                  f"{worst:.1e}", target_text, "ok")


# ---- measurements ------------------------------------------------------------------------------------------


def _step_time(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, target: torch.Tensor,
               steps: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


def optimizer_overhead(device: torch.device, group: dist.ProcessGroup, model_name: str, batch_size: int,
                       image_size: int, steps: int, rounds: int, max_ratio: float) -> Result:
    """torchring.DistributedOptimizer's bf16-autocast step time (ResNet-50 by default) divided by DDP's on the
    same model, data and backend, in alternating rounds; the median of the rounds' ratios."""
    name = "step time: DistributedOptimizer / DDP"
    target = f"<= {max_ratio:g}"
    if hvd.size() < 2:
        return skipped(name, TARGET, target, "skipped: at 1 rank DistributedOptimizer reduces nothing")
    make, classes = MODELS[model_name]
    torch.manual_seed(0)
    data = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, classes, (batch_size,), device=device)
    ours_model = make().to(device)
    ddp = DistributedDataParallel(copy.deepcopy(ours_model), device_ids=[device.index] if device.type == "cuda"
                                  else None, process_group=group)
    ours = hvd.DistributedOptimizer(torch.optim.SGD(ours_model.parameters(), lr=0.01, momentum=0.9),
                                    named_parameters=ours_model.named_parameters())
    theirs = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    _step_time(ddp, theirs, data, labels, 2, device)  # warm-up: cuDNN autotuning, allocator, DDP buckets
    _step_time(ours_model, ours, data, labels, 2, device)  # and the gradient lane's vote
    ratios, ours_times, ddp_times = [], [], []
    for index in range(rounds):
        order = ((ddp, theirs, ddp_times), (ours_model, ours, ours_times))
        for model, optimizer, times in order if index % 2 == 0 else reversed(order):
            times.append(_step_time(model, optimizer, data, labels, steps, device))
        ratios.append(ours_times[-1] / ddp_times[-1])
    ratio = statistics.median(ratios)
    measured = (f"{ratio:.3f} (torchring {statistics.median(ours_times) * 1e3:.1f} ms, DDP "
                f"{statistics.median(ddp_times) * 1e3:.1f} ms; {model_name}, batch {batch_size}, {image_size}px, "
                f"median of {rounds} rounds)")
    return Result(name, TARGET, measured, target, "met" if ratio <= max_ratio else "missed")


def fusion_batches(shapes: list[tuple[int, ...]], threshold: int) -> list[list[int]]:
    """Indices of the float32 gradients of ``shapes`` that the runtime fuses together: ``fusion.plan_batches``
    itself, on the responses these gradients would be (those of ``SEPARATE_AT_BYTES`` or more run alone and
    are left out here)."""
    responses = [Response(f"grad.{index}", 0, (0,), {0: RequestMeta(f"grad.{index}", OpType.ALLREDUCE, "float32",
                                                                     tuple(shape), reduce_op=int(ReduceOp.SUM))})
                 for index, shape in enumerate(shapes)]
    batches = [[int(response.name.split(".")[1]) for response in batch] for batch in plan_batches(responses, threshold)]
    return [batch for batch in batches if len(batch) > 1 or math.prod(shapes[batch[0]]) * 4 < SEPARATE_AT_BYTES]


def _timed(run: Callable[[], None], repeats: int, device: torch.device) -> float:
    run()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def fusion_copy_efficiency(device: torch.device, repeats: int, min_ratio: float, threshold: int) -> Result:
    """The fusion copies of ResNet-50's gradients as the executor makes them (``_launch_fused``: the tensors
    under SEPARATE_AT_BYTES, ``torch.cat(flat, out=fused)`` into a reused buffer, then
    ``copy_all(flat, fused.split(sizes))`` back out) against two plain device-to-device copies of as many
    bytes (in and out); the ratio of their bandwidths. Measured on rank 0 alone, the others wait."""
    name = "fusion copy bandwidth / plain copy"
    target = f">= {min_ratio:g}"
    if hvd.rank() != 0:
        return skipped(name, TARGET, target, "measured on rank 0")
    with torch.device("meta"):  # shapes only
        shapes = [p.shape for p in ResNet50().parameters()]
    batches = fusion_batches([tuple(shape) for shape in shapes], threshold)
    plans = []
    for batch in batches:
        buffers = [torch.randn(shapes[i], device=device) for i in batch]  # fp32 gradients
        fused = torch.empty(sum(b.numel() for b in buffers), device=device)  # the pool's reused buffer
        plans.append((buffers, fused))

    def fusion_copies() -> None:
        for buffers, fused in plans:
            flat = [b if b.dim() == 1 else b.view(-1) for b in buffers]
            sizes = [b.numel() for b in flat]
            torch.cat(flat, out=fused)
            copy_all(flat, fused.split(sizes))

    total = sum(fused.numel() for _, fused in plans)
    source, target_buffer = torch.randn(total, device=device), torch.empty(total, device=device)

    def plain_copies() -> None:
        target_buffer.copy_(source)
        source.copy_(target_buffer)

    fusion_s, plain_s = _timed(fusion_copies, repeats, device), _timed(plain_copies, repeats, device)
    moved = 2 * total * 4 / 1e9  # GB, in and out
    ratio = plain_s / fusion_s
    tensors = sum(len(buffers) for buffers, _ in plans)
    measured = (f"{ratio:.2f} ({tensors} tensors < {SEPARATE_AT_BYTES // 2**20} MB in {len(plans)} batch(es), "
                f"{total * 4 / 2**20:.1f} MB in and out: {moved / fusion_s:.1f} GB/s, plain {moved / plain_s:.1f} "
                f"GB/s)")
    return Result(name, TARGET, measured, target, "met" if ratio >= min_ratio else "missed")
