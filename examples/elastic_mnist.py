"""Elastic MNIST training: survives lost workers, grows onto new hosts, resumes after a restart.

    torchring run --min-np 2 --max-np 3 --host-discovery-script ./hosts.sh python examples/elastic_mnist.py
    TORCHRING_CHECKPOINT_DIR=/shared/ckpt torchring run --min-np 2 --max-np 4 -H a:2,b:2 \\
        python examples/elastic_mnist.py

Compared with ``mnist.py``: the model, optimizer and an ``ElasticSampler`` live in a
``hvd.elastic.TorchState``; the training function is wrapped with ``hvd.elastic.run``; progress is
committed every ``--commit-interval`` batches (and at each epoch's end). When a worker is lost, the
others roll back to the last commit and continue with the new membership; when hosts are added they
join at the next commit. With ``TORCHRING_CHECKPOINT_DIR`` set, every commit is also written there, and
a job restarted from scratch continues from the last one. The learning rate follows the job's size
(a reset callback rescales it).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from mnist_common import Net, load_datasets
from torch import optim
from torch.utils.data import DataLoader

import torchring as hvd
from torchring.logging_utils import get_logger


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Elastic MNIST with torchring (Horovod elastic API)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate for one rank")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--commit-interval", type=int, default=5, help="batches between commits")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per batch (for demos)")
    parser.add_argument("--data-dir", default=None, help="directory with torchvision's MNIST files")
    return parser.parse_args()


def evaluate(model: torch.nn.Module, test_set) -> float:
    """Accuracy on the test set, every rank taking a share (averaged with allreduce)."""
    model.eval()
    indices = list(range(hvd.rank(), len(test_set), hvd.size()))
    correct = 0
    with torch.no_grad():
        for start in range(0, len(indices), 256):
            batch = [test_set[i] for i in indices[start:start + 256]]
            data = torch.stack([item[0] for item in batch])
            target = torch.tensor([int(item[1]) for item in batch])
            correct += model(data).argmax(dim=1).eq(target).sum().item()
    totals = hvd.allreduce(torch.tensor([float(correct), float(len(indices))]), op=hvd.Sum, name="accuracy")
    return (totals[0] / totals[1]).item()


def main() -> None:
    args = parse_args()
    hvd.init()
    log = get_logger("elastic_mnist")
    torch.manual_seed(args.seed)
    train_set, test_set, source = load_datasets(args.data_dir)
    log.info("training on %s: %d train / %d test samples", source, len(train_set), len(test_set))

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=args.seed)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, batch=0)

    def on_reset() -> None:
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()
        log.info("membership changed: now %d ranks", hvd.size())

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            if state.sampler.epoch != state.epoch:
                state.sampler.set_epoch(state.epoch)
            loader = DataLoader(train_set, batch_size=args.batch_size, sampler=state.sampler)
            model.train()
            for data, target in loader:
                optimizer.zero_grad()
                loss = F.nll_loss(model(data), target)
                loss.backward()
                optimizer.step()
                state.batch += 1
                state.sampler.record_batch(state.batch, args.batch_size)
                if args.step_sleep:
                    import time

                    time.sleep(args.step_sleep)
                if state.batch % args.commit_interval == 0:
                    if hvd.rank() == 0:
                        print(f"Train Epoch: {state.epoch + 1} batch {state.batch} ranks {hvd.size()} "
                              f"loss {loss.item():.4f}", flush=True)
                    state.commit()
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    accuracy = evaluate(model, test_set)
    if hvd.rank() == 0:
        print(f"Test set: Accuracy: {accuracy:.4f} ({hvd.size()} ranks at the end)", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
