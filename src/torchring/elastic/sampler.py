"""``ElasticSampler``: shards a dataset over the current ranks and skips what this epoch already did."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from .. import basics


class ElasticSampler(Sampler[int]):
    """A distributed sampler whose partition follows the job's membership.

    Each rank iterates over its share of the samples not yet processed in the current epoch. Record
    progress with ``record_batch``/``record_indices``; after a membership change the remaining samples
    are re-partitioned over the new ranks (``TorchState`` does this in ``sync()``). ``set_epoch`` starts
    a new epoch with a fresh shuffle (``seed + epoch``) and nothing processed.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.indices: list[int] = []
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: new shuffle order, no sample processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the ``batch_idx``-th batch of this rank's share (of ``batch_size`` samples) as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Iterable[int]) -> None:
        """Mark dataset indices as processed in this epoch."""
        self.processed_indices.update(int(index) for index in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of this rank's ``batch_idx``-th batch."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict[str, Any]:
        """Epoch and processed indices (enough to continue the epoch on any membership)."""
        return {"epoch": self.epoch, "processed_indices": sorted(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict``, re-partitioned over the current ranks."""
        self.epoch = int(state_dict["epoch"])
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Re-partition the unprocessed samples over the current ranks (1 rank before ``init``)."""
        if basics.is_initialized():
            self.num_replicas, self.rank = basics.size(), basics.rank()
        else:
            self.num_replicas, self.rank = 1, 0
        self.remaining_indices = [i for i in range(len(self.dataset)) if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._shard()

    def _shard(self) -> list[int]:
        order = list(self.remaining_indices)
        if self.shuffle and order:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = [order[i] for i in torch.randperm(len(order), generator=generator).tolist()]
        if order and len(order) < self.total_size:  # pad so every rank gets the same number of batches
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
        return order[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
