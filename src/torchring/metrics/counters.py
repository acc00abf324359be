"""The numbers one rank keeps for its metrics: plain counters, updated where the work happens."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

#: The phases of a reduction whose time is counted.
PHASES = ("negotiation", "fusion_copy", "backend")


class Counters:
    """Counters of this process. Increments are plain attribute updates (cheap on the hot path); a
    lock only guards ``snapshot``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps = 0
        self.samples = 0
        self.step_seconds = 0.0
        self.last_step_at: float | None = None
        self.allreduce_bytes = 0
        self.allreduces = 0
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        self.fused_buffers = 0
        self.stalls = 0
        #: The GPU of this process's last CUDA operation (``runtime.devices``); None before any.
        self.cuda_device: int | None = None
        #: The runtime's own figures (response cache, rank, size), pushed here by ``runtime.context``
        #: (metrics sit below the runtime and never reach into it): {} while none is initialised.
        self.runtime_gauges: Callable[[], dict[str, Any]] = dict
        self.resets = 0

    def step(self) -> None:
        """An optimizer step finished (``DistributedOptimizer.step``)."""
        now = time.perf_counter()
        if self.last_step_at is not None:
            self.step_seconds += now - self.last_step_at
        self.last_step_at = now
        self.steps += 1

    def reduced(self, nbytes: int, count: int = 1) -> None:
        self.allreduce_bytes += nbytes
        self.allreduces += count

    def phase(self, name: str, seconds: float) -> None:
        self.phase_seconds[name] += seconds

    def snapshot(self) -> dict[str, Any]:
        """Every counter and gauge now, as plain JSON-able values."""
        with self._lock:
            data: dict[str, Any] = {
                "steps": self.steps, "samples": self.samples, "step_seconds": self.step_seconds,
                "allreduce_bytes": self.allreduce_bytes, "allreduces": self.allreduces,
                "phase_seconds": dict(self.phase_seconds), "fused_buffers": self.fused_buffers,
                "stalls": self.stalls, "resets": self.resets, "host": socket.gethostname(),
            }
        data.update(cache_hits=0, cache_misses=0, size=1)
        data.update(self.runtime_gauges())
        data.update(_cuda_gauges(self.cuda_device))
        return data


def _cuda_gauges(device: int | None) -> dict[str, Any]:
    """CUDA memory in use and GPU utilisation (NVML through nvidia-ml-py) where available."""
    import torch

    gauges: dict[str, Any] = {}
    if not torch.cuda.is_available():
        return gauges
    if device is None:  # no CUDA operation yet; this thread's current device would be GPU 0 on every rank
        return gauges
    gauges["cuda_memory_bytes"] = torch.cuda.memory_allocated(device)
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        gauges["gpu_utilization"] = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
    except Exception:  # noqa: BLE001 - nvidia-ml-py missing or no NVML: no utilisation gauge
        pass
    return gauges


#: This process's counters.
METRICS = Counters()


def record_samples(count: int) -> None:
    """Count ``count`` training samples processed by this rank (for samples/s)."""
    METRICS.samples += count
