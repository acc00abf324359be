"""The API in a single process with no launcher: size 1, no network."""

import pytest
import torch

import torchring as hvd


@pytest.fixture
def initialized():
    hvd.init()
    yield
    hvd.shutdown()


def test_topology_queries_raise_value_error_before_init():
    hvd.shutdown()
    for query in (hvd.size, hvd.rank, hvd.local_size, hvd.local_rank, hvd.cross_size, hvd.cross_rank):
        with pytest.raises(ValueError, match="has not been initialized"):
            query()
    assert not hvd.is_initialized()


def test_init_shutdown_init_in_one_process():
    for _ in range(3):
        hvd.init()
        hvd.init()  # a second init while initialised does nothing
        assert hvd.is_initialized() and (hvd.size(), hvd.rank()) == (1, 0)
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.ones(2))
        hvd.shutdown()
        assert not hvd.is_initialized()


def test_the_first_init_takes_the_objects_alive_then_out_of_full_collections_unless_told_not_to(monkeypatch):
    import gc

    from torchring.runtime import startup

    gc.unfreeze()
    monkeypatch.setattr(startup, "_gc_frozen", False)
    try:
        monkeypatch.setenv("TORCHRING_GC_FREEZE", "0")
        hvd.init()
        hvd.shutdown()
        assert gc.get_freeze_count() == 0
        monkeypatch.delenv("TORCHRING_GC_FREEZE")
        hvd.init()
        hvd.shutdown()
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
        hvd.init()  # a re-init (an elastic reset) freezes nothing: the last runtime's garbage stays collectable
        hvd.shutdown()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_collectives_with_one_rank(initialized):
    tensor = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(hvd.allreduce(tensor), tensor)
    assert torch.equal(hvd.allgather(tensor), tensor)
    assert torch.equal(hvd.broadcast(tensor, 0), tensor)
    hvd.barrier()
    assert hvd.broadcast_object({"k": [1, 2]}) == {"k": [1, 2]}
    assert hvd.allgather_object("x") == ["x"]


def test_operation_after_shutdown_raises_value_error():
    hvd.init()
    hvd.shutdown()
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(1))


def test_adasum_of_one_rank_is_its_tensor_and_reducescatter_refuses_it(initialized):
    assert torch.equal(hvd.allreduce(torch.tensor([1.0, 2.0]), op=hvd.Adasum), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="Adasum is defined for allreduce"):
        hvd.reducescatter(torch.ones(2), op=hvd.Adasum)
    with pytest.raises(ValueError, match="Adasum is defined for floating-point"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)


def test_unsupported_dtype_is_a_value_error(initialized):
    with pytest.raises(ValueError, match="complex"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))


def test_distributed_optimizer_with_one_rank_is_the_plain_optimizer(initialized):
    model = torch.nn.Linear(3, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    before = model.weight.detach().clone()
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    assert not torch.equal(before, model.weight)
    assert isinstance(optimizer, torch.optim.SGD)



def _rank_0_of_two(monkeypatch, tmp_path, start_timeout_s: int) -> None:
    """This process as rank 0 of a 2-rank torchrun-like job whose rank 1 never comes, with a flight record."""
    from tests.ports import free_port

    hvd.shutdown()
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                        "TORCHRING_START_TIMEOUT": str(start_timeout_s),
                        "TORCHRING_FLIGHT_RECORD": str(tmp_path / "flight.jsonl")}.items():
        monkeypatch.setenv(name, value)


def _waker_and_recorder_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith(("torchring-waker", "torchring-flight"))]


def test_a_rank_that_never_comes_leaves_no_thread_of_the_failed_init_behind(monkeypatch, tmp_path):
    # the waker and the flight recorder start before this rank's arrival is posted, and go when the meeting fails
    _rank_0_of_two(monkeypatch, tmp_path, start_timeout_s=1)
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1\] of 2 never called hvd.init\(\)"):
        hvd.init()
    assert not hvd.is_initialized()
    assert _waker_and_recorder_threads() == []


def test_a_failure_after_the_meeting_leaves_no_thread_behind_and_the_next_init_works(monkeypatch, tmp_path):
    # the timeline is opened last before the engine starts: its file cannot be made here (a file is in the way)
    hvd.shutdown()
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("TORCHRING_FLIGHT_RECORD", str(tmp_path / "flight.jsonl"))
    monkeypatch.setenv("HOROVOD_TIMELINE", str(tmp_path / "a-file" / "timeline.json"))
    with pytest.raises(OSError, match="timeline.json"):
        hvd.init()
    assert not hvd.is_initialized()
    assert _waker_and_recorder_threads() == []
    monkeypatch.setenv("HOROVOD_TIMELINE", str(tmp_path / "timeline.json"))
    hvd.init()
    try:
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.ones(2))
    finally:
        hvd.shutdown()
    assert (tmp_path / "timeline.json").exists()


def test_a_process_set_outside_the_job_is_refused_before_anything_starts(monkeypatch, tmp_path):
    _rank_0_of_two(monkeypatch, tmp_path, start_timeout_s=60)
    with pytest.raises(ValueError, match=r"process set ranks \[0, 3\] must be ranks of this job \(size 2\)"):
        hvd.init(process_sets=[hvd.ProcessSet([0, 3])])  # refused at once, not after the start timeout
    assert _waker_and_recorder_threads() == []
