"""Horovod-style MNIST training with torchring.

    torchring run -np 2 python examples/mnist.py
    torchring run -np 4 python examples/mnist.py --cuda --amp --data-dir ~/data

The changes from single-process training are Horovod's usual ones: ``hvd.init()``, the learning rate
scaled by ``hvd.size()``, a ``DistributedSampler``, ``broadcast_parameters`` and
``broadcast_optimizer_state`` from rank 0, ``DistributedOptimizer``, logging on rank 0 only, and the
test metrics averaged over ranks with ``allreduce``.

Messages go through ``torchring.logging_utils.get_logger`` (rank 0 only, to stderr, prefixed with the
rank and host) and the training loop through ``progress`` (a bar on a terminal, else a line per second
on stderr with the loss, samples/s over all ranks and the ETA). The ``Train Epoch`` and ``Test set``
lines stay on rank 0's stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F
from mnist_common import Net, load_datasets
from torch import optim
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import torchring as hvd
from torchring.logging_utils import get_logger, progress


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MNIST with torchring (Horovod API)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--test-batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate for one rank")
    parser.add_argument("--use-adasum", action="store_true",
                        help="combine the ranks' updates with Adasum (learning rate not scaled by the ranks)")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log-interval", type=int, default=10, help="batches between log lines")
    parser.add_argument("--data-dir", default=None, help="directory with torchvision's MNIST files")
    parser.add_argument("--cuda", action="store_true", help="train on the GPU of this rank's local rank")
    parser.add_argument("--amp", action="store_true", help="mixed precision (float16 on CUDA, bfloat16 on CPU)")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    return parser.parse_args()


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main() -> None:
    args = parse_args()
    hvd.init()
    log = get_logger("mnist")
    torch.manual_seed(args.seed)
    use_cuda = args.cuda and torch.cuda.is_available()
    if args.cuda and not use_cuda:
        log.warning("--cuda given but CUDA is not available; training on the CPU")
    # one GPU per rank; more ranks than GPUs share them (TORCHRING_CUDA_BACKEND=gloo: NCCL needs one each)
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
        torch.cuda.manual_seed(args.seed)

    train_set, test_set, source = load_datasets(args.data_dir)
    log.info("training on %s: %d train / %d test samples, %d ranks", source, len(train_set), len(test_set),
             hvd.size())
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    loader_options = {"num_workers": 1, "pin_memory": True} if use_cuda else {}
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler, **loader_options)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler, **loader_options)

    model = Net().to(device)
    lr_scaler = 1 if args.use_adasum else hvd.size()  # Adasum keeps the single-rank learning rate
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Adasum if args.use_adasum else hvd.Average)

    amp_dtype = torch.float16 if use_cuda else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda") if args.amp and use_cuda else None

    def autocast():
        if not args.amp:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=amp_dtype)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        bar = progress(train_loader, desc=f"epoch {epoch}/{args.epochs}", unit="batch", batch_size=args.batch_size)
        for batch_idx, (data, target) in enumerate(bar):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            with autocast():
                loss = F.nll_loss(model(data).float(), target)
            if scaler is not None:
                scaler.scale(loss).backward()
                optimizer.synchronize()
                scaler.unscale_(optimizer)
                with optimizer.skip_synchronize():
                    scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            bar.set(loss=loss)
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                seen = batch_idx * len(data)
                bar.write(f"Train Epoch: {epoch} [{seen}/{len(train_sampler)} "
                          f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}", file=sys.stdout)

    model.eval()
    test_loss = correct = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            with autocast():
                output = model(data).float()
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    accuracy = metric_average(correct / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
