"""``ElasticSampler``: shards a dataset over the current ranks and skips what this epoch already did."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sized
from typing import Any

from torch.utils.data import Sampler

from .. import basics


class ElasticSampler(Sampler[int]):
    """A distributed sampler whose partition follows the job's membership.

    Every rank sees the same shuffled order of the dataset (``seed + epoch``). Progress is counted job
    wide: ``record_batch(batch_idx, batch_size)`` adds ``batch_size * num_replicas`` processed samples,
    so after a membership change the samples after that point are re-partitioned over the new ranks
    (``TorchState`` does this in ``sync()``). ``record_indices`` marks individual indices as processed
    as well. Call ``set_epoch`` at the end of an epoch (or before the next one) to start over.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        #: Samples of this epoch's order already processed by the whole job.
        self.processed_num = 0
        #: Individual indices marked with ``record_indices``.
        self.processed_indices: set[int] = set()
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new shuffle order and nothing processed."""
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one batch of ``batch_size`` samples on every rank as processed."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices: Iterable[int]) -> None:
        """Mark individual dataset indices as processed in this epoch."""
        self.processed_indices.update(int(index) for index in indices)

    def state_dict(self) -> dict[str, Any]:
        """Epoch and progress (enough to continue the epoch on any membership)."""
        state: dict[str, Any] = {"epoch": self.epoch, "processed_num": self.processed_num}
        if self.processed_indices:
            state["processed_indices"] = sorted(self.processed_indices)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from ``state_dict``, re-partitioned over the current ranks."""
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict.get("processed_num", 0))
        self.processed_indices = set(state_dict.get("processed_indices", ()))
        self.reset()

    def reset(self) -> None:
        """Re-partition the unprocessed samples over the current ranks (1 rank before ``init``)."""
        if basics.is_initialized():
            self.num_replicas, self.rank = basics.size(), basics.rank()
        else:
            self.num_replicas, self.rank = 1, 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order[self.processed_num:] if i not in self.processed_indices]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._shard()

    def _shard(self) -> list[int]:
        order = list(self.remaining_indices)
        if order and len(order) < self.total_size:  # pad so every rank gets the same number of batches
            padding = self.total_size - len(order)
            order += (order * math.ceil(padding / len(order)))[:padding]
        return order[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        self.indices = self._shard()
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
