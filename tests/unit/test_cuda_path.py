"""What a CPU machine can check of the CUDA path: device indices in requests and in a joined rank's zeros,
no two devices in one fused buffer, the device-type check across ranks, the NCCL settings (timeout, error
handling), the Gloo backend for CUDA tensors, and the verdict on a collective only some ranks started."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from torchring.metrics.counters import METRICS
from torchring.runtime import devices
from torchring.runtime.coordination.fusion import plan_batches
from torchring.runtime.coordination.launch_failures import failure_of, launch_failure_verdict
from torchring.runtime.coordination.messages import Announcement
from torchring.runtime.coordination.negotiation import Response, check_consistency
from torchring.runtime.dataplane.cuda_groups import (
    ASYNC_ERROR_HANDLING,
    CudaGroupSettings,
    cuda_group,
    nccl_options,
    prepare_nccl_error_handling,
)
from torchring.runtime.dataplane.executor import joined_device
from torchring.runtime.dataplane.stall_watch import CudaStallWatch
from torchring.runtime.requests import OpType, RequestMeta, tensor_meta


def _meta(name: str, device: str, shape: tuple[int, ...] = (4,)) -> RequestMeta:
    return RequestMeta(name=name, op_type=OpType.ALLREDUCE, dtype="float32", shape=shape, device=device,
                       reduce_op=1)


def _response(name: str, *devices_by_rank: str) -> Response:
    return Response(name, 0, tuple(range(len(devices_by_rank))),
                    {rank: _meta(name, device) for rank, device in enumerate(devices_by_rank)})


def test_a_request_names_its_device_with_the_index():
    assert tensor_meta("x", OpType.ALLREDUCE, torch.ones(2), 0).device == "cpu"
    assert devices.device_name(torch.empty(2, device="meta")) == "meta"
    assert devices.device_type("cuda:3") == "cuda" and devices.is_cuda("cuda:3") and not devices.is_cuda("cpu")


def test_ranks_on_different_gpus_agree_but_cpu_and_cuda_do_not():
    assert check_consistency("x", {0: _meta("x", "cuda:0"), 1: _meta("x", "cuda:1")}) is None
    error = check_consistency("x", {0: _meta("x", "cuda:0"), 1: _meta("x", "cpu")})
    assert error is not None and "devices" in error


def test_tensors_of_two_devices_of_one_rank_never_share_a_buffer():
    same = [_response("a", "cuda:0", "cuda:1"), _response("b", "cuda:0", "cuda:1")]
    assert [len(batch) for batch in plan_batches(same, 1 << 20)] == [2]
    mixed = [_response("a", "cuda:0", "cuda:1"), _response("b", "cuda:0", "cuda:0")]  # rank 1: two GPUs
    assert [len(batch) for batch in plan_batches(mixed, 1 << 20)] == [1, 1]


def test_a_joined_rank_makes_its_zeros_on_its_own_gpu(monkeypatch):
    assert joined_device(_meta("x", "cpu"), join_device=-1) == torch.device("cpu")
    # another rank's metadata says cuda:0; this rank's join(device=3) wins
    assert joined_device(_meta("x", "cuda:0"), join_device=3) == torch.device("cuda", 3)
    monkeypatch.setattr(METRICS, "cuda_device", 2)
    assert joined_device(_meta("x", "cuda:0"), join_device=-1) == torch.device("cuda", 2)
    monkeypatch.setattr(METRICS, "cuda_device", None)
    with pytest.raises(RuntimeError, match=r"join\(device="):
        joined_device(_meta("x", "cuda:0"), join_device=-1)


def test_nccl_has_its_own_timeout_and_raises_instead_of_killing():
    assert CudaGroupSettings.read({}) == CudaGroupSettings("nccl", timedelta(seconds=600))
    assert CudaGroupSettings.read({"TORCHRING_NCCL_TIMEOUT_SECONDS": "90", "TORCHRING_CUDA_BACKEND": "GLOO"}) == \
        CudaGroupSettings("gloo", timedelta(seconds=90))
    env: dict[str, str] = {}
    assert prepare_nccl_error_handling(env) == "2" and env[ASYNC_ERROR_HANDLING] == "2"
    chosen = {ASYNC_ERROR_HANDLING: "1"}
    assert prepare_nccl_error_handling(chosen) == "1" and chosen[ASYNC_ERROR_HANDLING] == "1"  # the job's choice
    with pytest.raises(ValueError, match="TORCHRING_CUDA_BACKEND"):
        CudaGroupSettings.read({"TORCHRING_CUDA_BACKEND": "mpi"})


@pytest.mark.skipif(not hasattr(dist, "ProcessGroupNCCL"), reason="this torch build has no NCCL")
def test_the_timeout_reaches_the_nccl_options():
    assert nccl_options(timedelta(seconds=42))._timeout == timedelta(seconds=42)


def test_with_the_gloo_backend_cuda_tensors_use_the_sets_gloo_group():
    sentinel = object()
    assert cuda_group(None, 0, 2, sentinel, CudaGroupSettings("gloo")) is sentinel  # type: ignore[arg-type]


def test_a_collective_only_some_ranks_started_stops_every_rank_and_one_all_failed_does_not():
    response = _response("allreduce.x", "cuda:0", "cuda:1", "cuda:2")
    failure = failure_of(response, RuntimeError("CUDA out of memory"))
    some = [Announcement((), False), Announcement((), False, launch_failures=(failure,)), Announcement((), False)]
    verdict = launch_failure_verdict(some)
    assert "'allreduce.x' could not start on rank(s) [1]" in verdict and "CUDA out of memory" in verdict
    assert "rank(s) [0, 2] had started it" in verdict
    everyone = [Announcement((), False, launch_failures=(failure,)) for _ in range(3)]
    assert launch_failure_verdict(everyone) == "" and launch_failure_verdict(some[:1]) == ""


class _Collective:
    """Stands in for a CUDA collective's ``Work``: the watch only asks whether it completed."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def is_completed(self) -> bool:
        return self.done.is_set()


def test_a_cuda_bucket_still_running_after_the_warning_time_is_reported_from_the_watch_thread():
    warned: list[tuple[str, float]] = []
    got_warning = threading.Event()
    watch = CudaStallWatch(0.05, lambda name, waited: (warned.append((name, waited)), got_warning.set()),
                           poll_s=0.01)
    quick, slow = _Collective(), _Collective()
    quick.done.set()
    watch.watch(quick, "bucket.0.fc1.weight")
    watch.watch(slow, "bucket.1.fc2.weight")
    assert got_warning.wait(5.0)
    assert {name for name, _ in warned} == {"bucket.1.fc2.weight"} and all(waited >= 0.05 for _, waited in warned)
    slow.done.set()
    deadline = time.monotonic() + 5.0
    while watch.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.pending() == 0
    assert CudaStallWatch(0.0, lambda *_: None).watch(slow, "off") is None  # warnings off: nothing watched
