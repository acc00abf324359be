"""Build and capability queries: Horovod's names and return types, consistent with this torch build."""

import pytest
import torch
import torch.cuda.nccl
import torch.distributed as dist

from torchring import capabilities


def expected_nccl_code() -> int:
    """What nccl_built() should return for the installed torch, derived independently."""
    if torch.version.cuda is None and torch.version.hip is None:
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except Exception:
        return 0
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch


def test_gloo_is_built_and_enabled():
    assert capabilities.gloo_built() is dist.is_gloo_available()
    assert capabilities.gloo_enabled() is dist.is_gloo_available()
    assert capabilities.gloo_built() is True


def test_nccl_built_is_the_version_code_of_this_torch():
    code = capabilities.nccl_built()
    assert type(code) is int
    assert code == expected_nccl_code()
    if torch.version.cuda is None and torch.version.hip is None:
        assert code == 0
    else:
        assert bool(code) == dist.is_nccl_available()


@pytest.mark.parametrize(("version", "code"), [
    ((2, 19, 3), 21903),
    ((2, 21, 5, "+cuda12.4"), 22105),
    ((2, 9, 6), 20906),
    ((2, 8, 4), 2804),
    ((2, 7, 8), 2708),
])
def test_nccl_built_encodes_versions_like_nccl(monkeypatch, version, code):
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: version)
    assert capabilities.nccl_built() == code


def test_nccl_built_never_raises(monkeypatch):
    def broken():
        raise AttributeError("module 'torch._C' has no attribute '_nccl_version'")

    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda.nccl, "version", broken)
    assert capabilities.nccl_built() == 0


def test_cuda_and_rocm_built_follow_torch_version():
    assert capabilities.cuda_built() is (torch.version.cuda is not None)
    assert capabilities.rocm_built() is (torch.version.hip is not None)
    if "+cpu" in torch.__version__:
        assert capabilities.cuda_built() is False
        assert capabilities.rocm_built() is False


def test_unused_libraries_are_not_built():
    for query in (capabilities.mpi_built, capabilities.mpi_enabled, capabilities.ccl_built, capabilities.ddl_built):
        assert query() is False


def test_mpi_threads_supported_raises_without_mpi():
    with pytest.raises(ValueError, match="torchring does not use MPI"):
        capabilities.mpi_threads_supported()
