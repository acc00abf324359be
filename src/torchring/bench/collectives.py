"""The collectives benchmark, on every rank: torchring's operations against raw torch.distributed.

For each operation and size, the two implementations run in alternating order, iteration by
iteration, so that noise hits both alike. Each iteration starts after a barrier on the raw group; its
time is the slowest rank's (reduced with MAX at the end).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import torchring

from .horovod_peer import everyone_agrees, load_horovod
from .options import CollectivesOptions
from .sizes import ELEMENT_BYTES, format_size
from .stats import Summary, algbw, algorithm_bytes, busbw

#: Bytes each (operation, size) measurement moves when iterations are chosen automatically.
TARGET_BYTES = 512 * 1024**2
MIN_ITERS = 3
MAX_ITERS = 50
MAX_WARMUP = 5

IMPLEMENTATIONS = ("torchring", "raw")

# torch.distributed's allgather into one tensor: ``all_gather_single`` since torch 2.12, before that
# ``all_gather_into_tensor`` (now deprecated, with a warning).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def schedule(size: int, iters: int | None = None, warmup: int | None = None) -> tuple[int, int]:
    """(warm-up, timed) iterations for ``size`` bytes: about ``TARGET_BYTES`` in all, between
    ``MIN_ITERS`` and ``MAX_ITERS`` timed; explicit values win."""
    if iters is None:
        iters = max(MIN_ITERS, min(MAX_ITERS, TARGET_BYTES // size))
    if warmup is None:
        warmup = max(1, min(MAX_WARMUP, iters // 5))
    return warmup, iters


def _operations(op: str, size: int, rank: int, world_size: int) -> dict[str, Callable[[], Any]]:
    """One no-argument call per implementation of ``op`` on a float32 tensor of ``size`` bytes."""
    tensor = torch.full((size // ELEMENT_BYTES,), float(rank + 1))
    name = f"bench.{op}.{size}"
    if op == "allreduce":
        # Sum in place on both sides (values grow, which costs nothing extra).
        raw = tensor.clone()
        return {"torchring": lambda: torchring.allreduce_(tensor, name=name, op=torchring.Sum),
                "raw": lambda: dist.all_reduce(raw, op=dist.ReduceOp.SUM)}
    if op == "allgather":
        gathered = torch.empty(tensor.numel() * world_size)
        return {"torchring": lambda: torchring.allgather(tensor, name=name),
                "raw": lambda: _all_gather_single(gathered, tensor)}
    if op == "broadcast":
        return {"torchring": lambda: torchring.broadcast_(tensor, root_rank=0, name=name),
                "raw": lambda: dist.broadcast(tensor, src=0)}
    raise ValueError(f"unknown collective {op!r}")


def measure(op: str, size: int, warmup: int, iters: int) -> dict[str, list[float]]:
    """Per-iteration seconds (the slowest rank's) of each implementation of ``op`` at ``size`` bytes."""
    calls = _operations(op, size, dist.get_rank(), dist.get_world_size())
    times = torch.zeros(len(IMPLEMENTATIONS), iters, dtype=torch.float64)
    for iteration in range(warmup + iters):
        order = range(len(IMPLEMENTATIONS)) if iteration % 2 == 0 else reversed(range(len(IMPLEMENTATIONS)))
        for index in order:
            dist.barrier()
            start = time.perf_counter()
            calls[IMPLEMENTATIONS[index]]()
            elapsed = time.perf_counter() - start
            if iteration >= warmup:
                times[index, iteration - warmup] = elapsed
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return {impl: times[index].tolist() for index, impl in enumerate(IMPLEMENTATIONS)}


def _implementation_result(op: str, size: int, world_size: int, seconds: list[float]) -> dict[str, Any]:
    latency = Summary.of([s * 1000.0 for s in seconds])
    median_s = latency.median / 1000.0
    return {"latency_ms": latency.to_dict(),
            "algbw_gbps": algbw(op, size, world_size, median_s) / 1e9,
            "busbw_gbps": busbw(op, size, world_size, median_s) / 1e9}


#: The burst: this many 4 KB allreduces started asynchronously, then synchronized.
BURST_COUNT = 200
BURST_BYTES = 4096


def measure_burst(rounds: int = 10, horovod: Any = None) -> dict[str, Any]:
    """``BURST_COUNT`` × 4 KB: torchring ``allreduce_async_`` then ``synchronize`` (fused by the engine)
    against as many blocking raw ``all_reduce`` calls, and against the real Horovod's ``allreduce_async_``
    when ``horovod`` (its ``horovod.torch``, initialised) is given; the median of ``rounds`` alternating
    rounds."""
    tensors = [torch.full((BURST_BYTES // ELEMENT_BYTES,), float(i)) for i in range(BURST_COUNT)]
    contenders: list[tuple[str, Callable[[], None]]] = [
        ("torchring", lambda: async_burst(torchring, tensors, torchring.Sum)),
        ("raw_blocking", lambda: [dist.all_reduce(t) for t in tensors] and None)]
    if horovod is not None:
        contenders.append(("horovod", lambda: async_burst(horovod, tensors, horovod.Sum)))
    times = torch.zeros(len(contenders), rounds, dtype=torch.float64)
    for round_index in range(rounds + 1):  # the first round warms up
        for index, (_, run) in enumerate(contenders):
            dist.barrier()
            start = time.perf_counter()
            run()
            if round_index:
                times[index, round_index - 1] = time.perf_counter() - start
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    summaries = {name: Summary.of((times[index] * 1000).tolist()) for index, (name, _) in enumerate(contenders)}
    result = {"count": BURST_COUNT, "bytes": BURST_BYTES, "torchring_ms": summaries["torchring"].to_dict(),
              "raw_blocking_ms": summaries["raw_blocking"].to_dict(),
              "speedup": summaries["raw_blocking"].median / summaries["torchring"].median}
    if horovod is not None:
        result["horovod_ms"] = summaries["horovod"].to_dict()
        result["vs_horovod"] = summaries["horovod"].median / summaries["torchring"].median
    return result


def async_burst(api: Any, tensors: list[torch.Tensor], op: Any) -> None:
    """Start every allreduce, then wait for each (the Horovod API: torchring's and Horovod's own; also
    run by ``benchmarks/side_by_side`` under each one's launcher)."""
    handles = [api.allreduce_async_(t, name=f"bench.burst.{i}", op=op) for i, t in enumerate(tensors)]
    for handle in handles:
        api.synchronize(handle)


def run_collectives(options: CollectivesOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Measure every operation at every size; the result rank 0 reports."""
    world_size = dist.get_world_size()
    results = []
    for op in options.ops:
        for size in options.sizes:
            warmup, iters = schedule(size, options.iters, options.warmup)
            seconds = measure(op, size, warmup, iters)
            entry = {"op": op, "bytes": size, "algorithm_bytes": algorithm_bytes(op, size, world_size),
                     "warmup": warmup, "iters": iters}
            for impl in IMPLEMENTATIONS:
                entry[impl] = _implementation_result(op, size, world_size, seconds[impl])
            entry["ratio"] = entry["torchring"]["latency_ms"]["median"] / entry["raw"]["latency_ms"]["median"]
            results.append(entry)
            log(f"{op:<9} {format_size(size):>5}: torchring {entry['torchring']['latency_ms']['median']:.3f} ms, "
                f"raw gloo {entry['raw']['latency_ms']['median']:.3f} ms, ratio {entry['ratio']:.2f} "
                f"({iters} iterations)")
    result = {"mode": "collectives", "ops": list(options.ops), "sizes": list(options.sizes), "results": results}
    if "allreduce" in options.ops:
        horovod, reason = load_horovod(world_size)
        if not everyone_agrees(horovod is not None):
            horovod = None
            result["horovod_skipped"] = reason or "Horovod could not be used on every rank"
        burst = measure_burst(horovod=horovod)
        log(f"burst: {BURST_COUNT} x 4K allreduce_async + synchronize {burst['torchring_ms']['median']:.2f} ms, "
            f"{BURST_COUNT} blocking raw all_reduce {burst['raw_blocking_ms']['median']:.2f} ms, "
            f"speedup {burst['speedup']:.1f}x"
            + (f"; Horovod {burst['horovod_ms']['median']:.2f} ms" if "horovod_ms" in burst else ""))
        result["burst"] = burst
    return result
