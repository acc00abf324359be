"""What to do about a failed rank, from the last lines it wrote to stderr: one hint per recognisable
error (a missing ``horovod`` module, NCCL asked for where there is no CUDA), for the launcher's summary."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["hints_for"]

_NO_HOROVOD = (
    "the script imports horovod, which is not installed here: run it with 'torchring run --horovod-compat' "
    "(or 'horovodrun', which implies it), so that 'import horovod.torch as hvd' loads torchring"
)
_NCCL_NOT_BUILT = (
    "the script asked for the NCCL backend, but this torch is a CPU build (no CUDA, so no NCCL); use the "
    "'gloo' backend on CPU (torchring's collectives use Gloo for CPU tensors by themselves), or install a "
    "CUDA build of torch on a machine with a GPU"
)
_NCCL_NO_GPU = (
    "the script asked for the NCCL backend, but no CUDA GPU is visible to this rank; use the 'gloo' backend "
    "on CPU (torchring's collectives use Gloo for CPU tensors by themselves), or check CUDA_VISIBLE_DEVICES "
    "and the driver ('torchring doctor')"
)

#: (text a stderr line contains, the hint it calls for), checked in order.
_PATTERNS: tuple[tuple[str, str], ...] = (
    ("No module named 'horovod'", _NO_HOROVOD),
    ("doesn't have NCCL built in", _NCCL_NOT_BUILT),
    ("Torch not compiled with CUDA enabled", _NCCL_NOT_BUILT),
    ("ProcessGroupNCCL is only supported with GPUs", _NCCL_NO_GPU),
)


def hints_for(stderr_lines: Sequence[str]) -> list[str]:
    """The hints ``stderr_lines`` call for, each once, in the order of ``_PATTERNS``."""
    found: list[str] = []
    for text, hint in _PATTERNS:
        if hint not in found and any(text in line for line in stderr_lines):
            found.append(hint)
    return found
