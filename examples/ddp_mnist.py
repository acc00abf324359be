"""The same MNIST training with plain torch.distributed and DistributedDataParallel.

Nothing here is torchring-specific: ``torchring run`` sets the variables torchrun would set
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), so

    torchring run -np 2 python examples/ddp_mnist.py

works exactly like ``torchrun --nproc-per-node 2 examples/ddp_mnist.py``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mnist_common import Net, load_datasets
from torch import optim
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="MNIST with DistributedDataParallel")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--test-batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate for one rank")
    parser.add_argument("--momentum", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--cuda", action="store_true")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    use_cuda = args.cuda and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", init_method="env://")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    torch.manual_seed(args.seed)

    train_set, test_set, source = load_datasets(args.data_dir)
    if rank == 0:
        print(f"training on {source} with DDP, {world_size} ranks")
    train_sampler = DistributedSampler(train_set)
    test_sampler = DistributedSampler(test_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = DistributedDataParallel(Net().to(device), device_ids=[local_rank] if use_cuda else None)
    optimizer = optim.SGD(model.parameters(), lr=args.lr * world_size, momentum=args.momentum)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and rank == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]\tLoss: {loss.item():.6f}")

    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            totals[0] += F.nll_loss(output, target, reduction="sum").item()
            totals[1] += output.argmax(dim=1).eq(target).sum().item()
            totals[2] += len(target)
    dist.all_reduce(totals)
    if rank == 0:
        print(f"Test set: Average loss: {totals[0] / totals[2]:.4f}, Accuracy: {totals[1] / totals[2]:.4f}")


if __name__ == "__main__":
    main()
    # Once main()'s tensors are gone, let Gloo's threads finish with them before the interpreter exits;
    # without this, torch 2.x can abort at exit with "terminate called without an active exception".
    dist.barrier()
    dist.destroy_process_group()
    # Even so, torch 2.13 still aborted at exit now and then (once in a few runs in a container), after
    # training had finished: everything is done and printed, so leave without the interpreter's finalizers.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
