"""How each kind of value in an elastic state is saved, restored, synchronised and persisted."""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler


class StateHandler:
    """Keeps one value and its last committed copy."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value
        self.saved: Any = None
        self.save()

    def save(self) -> None:
        """Remember the current value as the committed one."""
        self.saved = copy.deepcopy(self.value)

    def restore(self) -> None:
        """Go back to the committed value."""
        self.value = copy.deepcopy(self.saved)

    def sync(self, root_rank: int = 0) -> None:
        """Make every rank's value equal to ``root_rank``'s."""
        self.value = broadcast_object(self.value, root_rank=root_rank, name=f"elastic.{self.name}")

    def snapshot(self) -> Any:
        """The committed value, as written to a checkpoint (may run collectives; every rank calls it)."""
        return self.saved

    def load(self, snapshot: Any) -> None:
        """Take a checkpoint's value as both current and committed."""
        self.saved = snapshot
        self.restore()


class StateDictHandler(StateHandler):
    """A value with ``state_dict``/``load_state_dict``: a deep copy of its state is what gets committed
    (restored as a copy too, so later in-place updates never reach the commit)."""

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))


class ModuleHandler(StateDictHandler):
    """A ``torch.nn.Module``: parameters and buffers are broadcast from rank 0."""

    def sync(self, root_rank: int = 0) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=root_rank)


class OptimizerHandler(StateDictHandler):
    """A ``torch.optim.Optimizer`` (or torchring's DistributedOptimizer): state and hyper-parameters."""

    def sync(self, root_rank: int = 0) -> None:
        broadcast_optimizer_state(self.value, root_rank=root_rank)


class SamplerHandler(StateDictHandler):
    """An ``ElasticSampler``: its progress is job wide; indices marked by any rank count for all."""

    def sync(self, root_rank: int = 0) -> None:
        state = self.value.state_dict()
        merged = _union(allgather_object(state.get("processed_indices", []), name=f"elastic.{self.name}.indices"))
        if merged:
            state["processed_indices"] = merged
        self.value.load_state_dict(broadcast_object(state, root_rank=root_rank, name=f"elastic.{self.name}"))

    def snapshot(self) -> Any:
        merged = _union(allgather_object(self.saved.get("processed_indices", []),
                                         name=f"elastic.{self.name}.snapshot"))
        return {**self.saved, "processed_indices": merged} if merged else dict(self.saved)


class SchedulerHandler(StateDictHandler):
    """A learning-rate scheduler, synchronised from rank 0."""

    def sync(self, root_rank: int = 0) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=root_rank,
                                                    name=f"elastic.{self.name}"))


def _union(index_lists: list[list[int]]) -> list[int]:
    return sorted(set().union(*index_lists)) if index_lists else []


def is_special(value: Any) -> bool:
    """True for values kept by a dedicated handler (modules, optimizers, samplers, schedulers)."""
    return isinstance(value, (torch.nn.Module, torch.optim.Optimizer, ElasticSampler,
                              torch.optim.lr_scheduler.LRScheduler))


def handler_for(name: str, value: Any) -> StateHandler:
    """The handler that knows how to keep ``value``."""
    if isinstance(value, torch.nn.Module):
        return ModuleHandler(name, value)
    if isinstance(value, torch.optim.Optimizer):
        return OptimizerHandler(name, value)
    if isinstance(value, ElasticSampler):
        return SamplerHandler(name, value)
    if isinstance(value, torch.optim.lr_scheduler.LRScheduler):
        return SchedulerHandler(name, value)
    return StateHandler(name, value)
