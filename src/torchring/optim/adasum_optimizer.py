"""``DistributedOptimizer(op=hvd.Adasum)``: Horovod's Adasum optimizer.

Adasum combines *updates*, not raw gradients: each rank steps the wrapped optimizer on its own gradients
(its own learning rate, momentum and state), the ranks combine their updates (parameters after the step
minus before) with Adasum, and every rank applies the combined update to the parameters it started the
step from. Identical updates are kept once and orthogonal ones add up, which is what lets large-batch
training keep the single-rank learning rate.

The updates travel as one grouped allreduce through the engine (``op=Adasum``: fused into one buffer,
with Adasum's coefficients computed tensor by tensor); ``backward_passes_per_step`` accumulates gradients
locally as with any optimizer (call ``step()`` every that many passes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..compression import Compressor
from ..process_sets import ProcessSet
from ..reduction import Adasum
from .parameters import default_names, validate_named_parameters

__all__ = ["DistributedAdasumOptimizer"]


class DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Mixed in before the wrapped optimizer's class by ``DistributedOptimizer(op=Adasum)``."""

    def _setup_adasum(self, named_parameters: Sequence[Any] | None, compression: type[Compressor],
                      process_set: ProcessSet) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            self._parameter_names = validate_named_parameters(list(named_parameters), params)
        else:
            self._parameter_names = default_names(self.param_groups)
        self._params = [p for p in params if p.requires_grad]
        self._compression = compression
        self._process_set = process_set
        self.op = Adasum

    def synchronize(self) -> None:
        """Nothing is in flight between steps: the updates are combined inside ``step()``."""

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Horovod's API; there is nothing to skip here."""
        yield

    def step(self, closure: Callable[[], float] | None = None) -> Any:  # type: ignore[override]
        """Step on this rank's gradients, then replace the update by the Adasum of every rank's."""
        stepped = [p for p in self._params if p.grad is not None]
        starts = [p.detach().clone() for p in stepped]
        loss = super().step(closure)
        process_set = self._process_set
        if not stepped or not process_set.included() or process_set.size() == 1:
            return loss
        from ..grouped import grouped_allreduce

        with torch.no_grad():
            updates, contexts = [], []
            for param, start in zip(stepped, starts, strict=True):
                compressed, context = self._compression.compress(param.detach() - start)
                updates.append(compressed)
                contexts.append(context)
            combined = grouped_allreduce(updates, op=Adasum, name="adasum.update", process_set=process_set)
            for param, start, update, context in zip(stepped, starts, combined, contexts, strict=True):
                param.copy_(start + self._compression.decompress(update, context).to(param.dtype))
        return loss
