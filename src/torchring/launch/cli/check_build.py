"""``torchring run --check-build``: what this installation can do, in horovodrun's layout."""

from __future__ import annotations

from ...version import __version__


def _box(available: bool) -> str:
    return "[X]" if available else "[ ]"


def check_build_report() -> str:
    """The frameworks, controllers and tensor operations available here."""
    import torch  # here, not with the module: the launcher loads torch only once it needs it

    from ... import capabilities

    nccl = bool(capabilities.nccl_built()) and torch.cuda.is_available()
    lines = [
        f"torchring v{__version__} (torch {torch.__version__}):",
        "",
        "Available Frameworks:",
        f"    {_box(False)} TensorFlow",
        f"    {_box(True)} PyTorch",
        f"    {_box(False)} MXNet",
        "",
        "Available Controllers:",
        f"    {_box(capabilities.mpi_built())} MPI",
        f"    {_box(capabilities.gloo_built())} Gloo",
        "",
        "Available Tensor Operations:",
        f"    {_box(nccl)} NCCL" + ("" if nccl or not capabilities.nccl_built() else " (built, but no CUDA device)"),
        f"    {_box(False)} DDL",
        f"    {_box(capabilities.ccl_built())} CCL",
        f"    {_box(capabilities.mpi_built())} MPI",
        f"    {_box(capabilities.gloo_built())} Gloo",
    ]
    return "\n".join(lines)
