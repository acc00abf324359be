"""Elastic training state: what ``commit()`` saves, ``restore()`` rolls back to and ``sync()`` shares."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from .. import basics
from ..exceptions import HostsUpdatedInterrupt
from ..functions import broadcast_object
from ..runtime import context
from .checkpoint import read_checkpoint, resolve_checkpoint_dir, write_checkpoint
from .handlers import handler_for, is_special
from .membership import current_hosts_version, elastic_mode

logger = logging.getLogger("torchring.elastic")

#: ``_sync_root``'s offset for ranks that never synced: their keys are above any rank's that did.
_NEVER_SYNCED = 2**62


class State:
    """Base of elastic states: reset callbacks, host-update checks and on-disk persistence.

    Subclasses keep their values in handlers (see ``ObjectState``); ``commit()`` saves them,
    persists them when a checkpoint directory is set, and checks whether hosts changed.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None = None) -> None:
        object.__setattr__(self, "_handlers", {})
        object.__setattr__(self, "_reset_callbacks", [])
        object.__setattr__(self, "_checkpoint_dir", resolve_checkpoint_dir(checkpoint_dir))
        object.__setattr__(self, "_commits", 0)
        object.__setattr__(self, "_resume_checked", False)
        object.__setattr__(self, "_synced", False)
        object.__setattr__(self, "_hosts_seen", current_hosts_version())

    # -- values ---------------------------------------------------------------------------------
    def _add_value(self, name: str, value: Any) -> None:
        self._handlers[name] = handler_for(name, value)

    def __getattr__(self, name: str) -> Any:
        handlers = object.__getattribute__(self, "_handlers")
        if name in handlers:
            return handlers[name].value
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._handlers:
            handler = self._handlers[name]
            if is_special(value) or is_special(handler.value):  # a new model/optimizer/...: keep it as committed
                self._handlers[name] = handler_for(name, value)
            else:
                handler.value = value
        elif name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._add_value(name, value)

    # -- Horovod's State API --------------------------------------------------------------------
    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions called (in order) after every reset, e.g. to scale the learning rate to the new size."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``elastic.run`` after re-initialising with the new membership."""
        object.__setattr__(self, "_hosts_seen", current_hosts_version())
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (and persist it when a checkpoint directory is set), then check host updates."""
        self.save()
        object.__setattr__(self, "_commits", self._commits + 1)
        if self._checkpoint_dir is not None:
            self.persist()
        context.note_step()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank, at this same point, when hosts were added or removed."""
        if not elastic_mode():
            return
        seen = self._hosts_seen
        latest = current_hosts_version() if basics.rank() == 0 else None
        latest = broadcast_object(latest, root_rank=0, name="elastic.hosts_version")
        if latest is None or latest.version == seen.version:
            return
        object.__setattr__(self, "_hosts_seen", latest)
        raise HostsUpdatedInterrupt(skip_sync=latest.removed_only)

    def save(self) -> None:
        """Remember the current values as the last commit (in memory)."""
        for handler in self._handlers.values():
            handler.save()

    def restore(self) -> None:
        """Roll every value back to the last commit."""
        for handler in self._handlers.values():
            handler.restore()

    def sync(self) -> None:
        """Make every rank's values equal to those of the rank with the newest commit (rank 0's after the
        start, as in Horovod, where every rank committed as often), and commit them. Ranks new to the job
        (they never synced) never give their values while a rank that trained before takes part.

        The newest commit matters after a failure: a collective can finish on one survivor and fail on
        another, so one rank may have committed the step the others rolled back; taking rank 0's older
        values would train that step (and process its samples) a second time.

        The first sync of a state whose checkpoint directory holds a commit resumes from it: rank 0
        loads the file and the broadcast hands it to every rank.
        """
        if not self._resume_checked:
            object.__setattr__(self, "_resume_checked", True)
            self._resume_from_checkpoint()
        root, commits = self._sync_root()
        for handler in self._handlers.values():
            handler.sync(root)
        object.__setattr__(self, "_commits", commits)
        object.__setattr__(self, "_synced", True)
        self.save()

    def _sync_root(self) -> tuple[int, int]:
        """The rank whose values every rank takes, and its count of commits (from then on the job's):
        among the ranks that synced before, the one with the most commits (the lowest such rank on a tie);
        rank 0 (with the commits of the checkpoint it resumed from) when no rank synced before. One MIN
        allreduce of ``rank - commits * size``, offset by ``_NEVER_SYNCED`` for ranks that never synced."""
        if not basics.is_initialized() or basics.size() == 1:
            return 0, self._commits
        from ..collectives import allreduce
        from ..reduction import ReduceOp

        rank, size = basics.rank(), basics.size()
        if self._synced:
            mine = rank - self._commits * size
        else:
            mine = _NEVER_SYNCED - self._commits * size if rank == 0 else _NEVER_SYNCED + rank
        lowest = int(allreduce(torch.tensor([mine], dtype=torch.int64), op=ReduceOp.MIN,
                               name="elastic.sync_root").item())
        if lowest > _NEVER_SYNCED // 2:  # nobody synced before: rank 0's key
            lowest -= _NEVER_SYNCED
        root = lowest % size
        return root, (root - lowest) // size

    def reset(self) -> None:
        """Hook for subclasses, run before the reset callbacks."""

    # -- persistence ----------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path | None:
        """The directory commits persist to, or None."""
        return self._checkpoint_dir

    def persist(self) -> None:
        """Write the last commit to the checkpoint directory (rank 0 writes; every rank must call it)."""
        if self._checkpoint_dir is None:
            raise ValueError("no checkpoint directory: pass checkpoint_dir= or set TORCHRING_CHECKPOINT_DIR")
        snapshot = {name: handler.snapshot() for name, handler in self._handlers.items()}
        if not basics.is_initialized() or basics.rank() == 0:
            write_checkpoint(self._checkpoint_dir, snapshot, self._commits)

    def _resume_from_checkpoint(self) -> None:
        if self._checkpoint_dir is None:
            return
        if basics.is_initialized() and basics.rank() != 0:
            return
        payload = read_checkpoint(self._checkpoint_dir)
        if payload is None:
            return
        stored = payload["state"]
        unknown = sorted(set(stored) - set(self._handlers))
        missing = sorted(set(self._handlers) - set(stored))
        if unknown or missing:
            raise RuntimeError(
                f"the checkpoint in {self._checkpoint_dir} holds {sorted(stored)} but this state has "
                f"{sorted(self._handlers)}; point TORCHRING_CHECKPOINT_DIR at this job's own directory"
            )
        for name, handler in self._handlers.items():
            handler.load(stored[name])
        object.__setattr__(self, "_commits", int(payload.get("commits", 0)))
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(payload.get("time", 0)))
        logger.warning("resuming from the checkpoint in %s (commit %d, written %s)",
                       self._checkpoint_dir, self._commits, written)


class ObjectState(State):
    """Elastic state of plain Python values: ``ObjectState(epoch=0, batch=0)``; read them as attributes."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        super().__init__(checkpoint_dir)
        for name, value in kwargs.items():
            self._add_value(name, value)


class TorchState(ObjectState):
    """Elastic state of a model, an optimizer and other values (an ``ElasticSampler`` among them).

    ``state.model``, ``state.optimizer`` and every keyword are attributes. Models are synchronised by
    broadcasting parameters and buffers, optimizers by broadcasting their state, samplers by merging
    the samples every rank processed, and other values by broadcasting rank 0's object.
    """

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 checkpoint_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        super().__init__(checkpoint_dir, model=model, optimizer=optimizer, **kwargs)
