"""Build and capability queries with Horovod's names and return types (``hvd.nccl_built()``, ...).

torchring has no native build of its own: what it can use is what the installed torch provides.
Gloo comes with ``torch.distributed``, NCCL with a CUDA build of torch; MPI, oneCCL and DDL are
never used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _nccl_version_code(version: Sequence[object]) -> int:
    """NCCL's ``NCCL_VERSION_CODE`` for ``(major, minor, patch[, suffix])``.

    NCCL 2.9 and later encode ``major*10000 + minor*100 + patch``; earlier releases used
    ``major*1000 + minor*100 + patch``.
    """
    major, minor, patch = (int(part) for part in version[:3])
    if major <= 2 and minor <= 8:
        return major * 1000 + minor * 100 + patch
    return major * 10000 + minor * 100 + patch


def gloo_built() -> bool:
    """True when ``torch.distributed`` comes with the Gloo backend."""
    return bool(dist.is_available() and dist.is_gloo_available())


def gloo_enabled() -> bool:
    """True when Gloo can be used at run time (it carries every CPU tensor)."""
    return gloo_built()


def nccl_built() -> int:
    """The NCCL version code torch was built with (e.g. ``21903`` for 2.19.3), or 0 without NCCL.

    Like Horovod, the value is an ``int`` that is truthy exactly when NCCL is available. Never raises.
    """
    try:
        if torch.version.cuda is None and torch.version.hip is None:
            return 0
        import torch.cuda.nccl as nccl

        return _nccl_version_code(nccl.version())
    except Exception:
        return 0


def mpi_built() -> bool:
    """False: torchring does not use MPI (``mpirun`` may still start its ranks)."""
    return False


def mpi_enabled() -> bool:
    """False: torchring does not use MPI."""
    return False


def mpi_threads_supported() -> bool:
    """Horovod's query about MPI thread support; always raises, since MPI is never enabled here."""
    raise ValueError("mpi_threads_supported() is only defined when MPI is enabled; torchring does not use MPI "
                     "(mpi_enabled() is False).")


def cuda_built() -> bool:
    """True when torch was built with CUDA (``torch.version.cuda`` is set)."""
    return torch.version.cuda is not None


def rocm_built() -> bool:
    """True when torch was built with ROCm (``torch.version.hip`` is set)."""
    return torch.version.hip is not None


def ccl_built() -> bool:
    """False: torchring does not use oneCCL."""
    return False


def ddl_built() -> bool:
    """False: torchring does not use IBM DDL."""
    return False
