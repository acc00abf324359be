"""The process groups that move one process set's tensor data: a Gloo group for CPU tensors and, where
NCCL is available, an NCCL group for CUDA tensors. The executor, the process-set table and the gradient
lanes all use them."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ..devices import is_cuda


@dataclass
class DataGroups:
    """The process groups that move tensor data for one process set, one per device kind."""

    cpu: dist.ProcessGroup | None
    cuda: dist.ProcessGroup | None = None

    def for_device(self, device: str, size: int) -> dist.ProcessGroup | None:
        """The group for tensors on ``device``; None only in a set of one rank without such a group."""
        group = self.cuda if is_cuda(device) else self.cpu
        if group is None and size > 1:
            raise RuntimeError(
                f"no process group for {device} tensors: NCCL is unavailable in this torch build; "
                "move the tensor to the CPU or install a CUDA build of torch"
            )
        return group

    def shutdown(self) -> None:
        """Release the groups (a group whose peer is gone may refuse; that is fine here) and drop them,
        so that they are destroyed even while something still holds these ``DataGroups`` (an
        optimizer's lane): a destroyed group has joined its threads (see ``context.shutdown``)."""
        groups, self.cpu, self.cuda = (self.cpu, self.cuda), None, None
        for group in groups:
            if group is not None and hasattr(group, "shutdown"):
                try:
                    group.shutdown()
                except Exception:  # noqa: BLE001
                    pass
