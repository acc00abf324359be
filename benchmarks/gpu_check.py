"""GPU checks for one CUDA device: DistributedOptimizer's cost on a ResNet-50 step and fusion-copy bandwidth.

Run it through the launcher (``make gpu-check`` does):

    torchring run -np 1 python benchmarks/gpu_check.py

1. ResNet-50 on synthetic 224x224 images in bf16 autocast: the mean step time with a plain SGD
   optimizer and with ``torchring.DistributedOptimizer`` around it, in alternating rounds; prints the
   overhead in percent (target: at most 2 %).
2. Fusion copies: ResNet-50's gradients packed into one buffer the way the engine fuses them
   (``torch.cat`` into a reused buffer) against one device-to-device copy of as many bytes; prints the
   ratio of bandwidths (target: at least 0.70).
3. The engine on CUDA tensors: a fused burst of allreduces and an allreduce of 64 MB, checked for values.

``--device cpu`` runs the same code on the CPU with small sizes (used by the test suite).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import torchring as hvd
from torchring.bench.models import ResNet50


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_time(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: torch.Tensor, target: torch.Tensor,
               steps: int, device: torch.device) -> float:
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    _synchronize(device)
    return (time.perf_counter() - start) / steps


def optimizer_overhead(device: torch.device, batch_size: int, image_size: int, steps: int, rounds: int) -> float:
    """Percent by which DistributedOptimizer lengthens a ResNet-50 training step."""
    torch.manual_seed(0)
    data = torch.randn(batch_size, 3, image_size, image_size, device=device)
    target = torch.randint(0, 1000, (batch_size,), device=device)
    plain_model, wrapped_model = ResNet50().to(device), ResNet50().to(device)
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.01, momentum=0.9)
    wrapped = hvd.DistributedOptimizer(torch.optim.SGD(wrapped_model.parameters(), lr=0.01, momentum=0.9),
                                       named_parameters=wrapped_model.named_parameters())
    _step_time(plain_model, plain, data, target, 2, device)  # warm-up (cuDNN autotuning, allocator)
    _step_time(wrapped_model, wrapped, data, target, 2, device)
    plain_times, wrapped_times = [], []
    for _ in range(rounds):
        plain_times.append(_step_time(plain_model, plain, data, target, steps, device))
        wrapped_times.append(_step_time(wrapped_model, wrapped, data, target, steps, device))
    plain_ms, wrapped_ms = statistics.median(plain_times) * 1e3, statistics.median(wrapped_times) * 1e3
    overhead = (wrapped_ms / plain_ms - 1.0) * 100.0
    print(f"ResNet-50 bf16 step, batch {batch_size}: plain {plain_ms:.2f} ms, DistributedOptimizer "
          f"{wrapped_ms:.2f} ms, overhead {overhead:+.2f}% (target <= 2%)", flush=True)
    return overhead


def fusion_copy_efficiency(device: torch.device, repeats: int) -> float:
    """Bandwidth of packing ResNet-50's gradients into a fusion buffer relative to one plain copy."""
    grads = [torch.randn_like(p) for p in ResNet50().to(device).parameters()]
    total = sum(g.numel() for g in grads)
    fused = torch.empty(total, device=device)
    source, target = torch.randn(total, device=device), torch.empty(total, device=device)

    def timed(run: callable) -> float:
        run()
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        _synchronize(device)
        return (time.perf_counter() - start) / repeats

    packing = timed(lambda: torch.cat([g.reshape(-1) for g in grads], out=fused))
    plain = timed(lambda: target.copy_(source))
    ratio = plain / packing
    gigabytes = total * 4 / 1e9
    print(f"fusion copy of {len(grads)} tensors ({gigabytes * 1e3:.0f} MB): {gigabytes / packing:.1f} GB/s, plain "
          f"copy {gigabytes / plain:.1f} GB/s, ratio {ratio:.2f} (target >= 0.70)", flush=True)
    return ratio


def engine_on_device(device: torch.device, big_elements: int) -> None:
    """A fused burst and one large allreduce through the engine, with their values checked."""
    size = hvd.size()
    tensors = [torch.full((1024,), float(i), device=device) for i in range(200)]
    handles = [hvd.allreduce_async_(t, name=f"gpu_check.burst.{i}", op=hvd.Sum) for i, t in enumerate(tensors)]
    for i, handle in enumerate(handles):
        assert torch.equal(hvd.synchronize(handle), torch.full((1024,), float(i * size), device=device))
    big = torch.ones(big_elements, device=device)
    _synchronize(device)
    start = time.perf_counter()
    hvd.allreduce_(big, name="gpu_check.big", op=hvd.Sum)
    _synchronize(device)
    assert torch.equal(big[:4], torch.full((4,), float(size), device=device))
    print(f"engine on {device}: 200 fused allreduces ok, {big_elements * 4 / 2**20:.2f} MB allreduce in "
          f"{(time.perf_counter() - start) * 1e3:.2f} ms", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; run with --device cpu to try the script on the CPU")
        return 2
    hvd.init()
    device = torch.device(args.device, hvd.local_rank()) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    overhead = optimizer_overhead(device, args.batch_size, args.image_size, args.steps, args.rounds)
    ratio = fusion_copy_efficiency(device, repeats=20 if device.type == "cuda" else 2)
    engine_on_device(device, 16 * 2**20 if device.type == "cuda" else 2**16)
    hvd.shutdown()
    met = overhead <= 2.0 and ratio >= 0.70
    print("gpu_check: targets " + ("met" if met else "NOT met"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
