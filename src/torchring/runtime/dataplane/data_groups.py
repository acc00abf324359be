"""The process groups that move one process set's tensor data: a Gloo group for CPU tensors and, where
NCCL is available, an NCCL group for CUDA tensors. The executor, the process-set table and the gradient
lanes all use them."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ..devices import is_cuda
from ..group_reaper import retire


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
        """Release the groups (a group whose peer is gone may refuse; that is fine here) and hand them to
        the reaper (``group_reaper``), which destroys them, joining their threads, once nothing else
        refers to them: these ``DataGroups`` no longer do, even while something still holds them (an
        optimizer's lane)."""
        groups, self.cpu, self.cuda = [self.cpu, self.cuda], None, None
        while groups:
            group = groups.pop()
            if group is None:
                continue
            if hasattr(group, "shutdown"):
                try:
                    group.shutdown()
                except Exception:  # noqa: BLE001
                    pass
            retire(group)
            del group
