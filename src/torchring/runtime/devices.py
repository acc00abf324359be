"""Which device a request's tensor is on, as the runtime names it.

A request's metadata says ``"cpu"`` or ``"cuda:<index>"``: the index travels with the request from its
submission, so the engine, the zeros of a joined rank, the fusion buffers and the metrics use the rank's
own GPU, never the engine thread's current device (which is GPU 0: that thread never sets one). Ranks
usually use different indices (their local rank), so only the device *type* must match across ranks;
the indices of every member take part in the fusion rule instead (``coordination.fusion``), which keeps
tensors of two devices out of one buffer on every rank alike.
"""

from __future__ import annotations

import torch

from ..metrics.counters import METRICS

__all__ = ["device_name", "device_type", "is_cuda", "last_cuda_device", "note_cuda_device"]


def device_name(tensor: torch.Tensor) -> str:
    """``"cpu"`` or ``"cuda:<index>"`` for ``tensor``."""
    if tensor.is_cpu:
        return "cpu"
    device = tensor.device
    return f"{device.type}:{device.index}" if device.index is not None else device.type


def note_cuda_device(index: int) -> None:
    """Remember that this process submits tensors on CUDA device ``index`` (its GPU, for the metrics and for
    the zeros of a joined rank)."""
    METRICS.cuda_device = index


def last_cuda_device() -> int | None:
    """The CUDA device this process last submitted a tensor on, or None."""
    return METRICS.cuda_device


def device_type(name: str) -> str:
    """``"cuda"`` for ``"cuda:1"`` (and for the bare ``"cuda"`` of older metadata), ``"cpu"`` for ``"cpu"``."""
    return name.partition(":")[0]


def is_cuda(name: str) -> bool:
    """Whether a request's device name is a CUDA device."""
    return name.startswith("cuda")
