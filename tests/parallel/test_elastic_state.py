"""Elastic states, the elastic sampler and ``elastic.run`` on real Gloo groups."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

import torchring as hvd
from torchring.contract import HOSTS_VERSION_KEY
from torchring.elastic.checkpoint import CHECKPOINT_FILE
from torchring.runtime import context


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))


@pytest.fixture
def shared_dir(rank):
    """A directory rank 0 creates and every rank knows (all ranks run on this host); removed afterwards."""
    created = tempfile.mkdtemp(prefix="torchring-elastic-test-") if rank == 0 else None
    directory = Path(hvd.broadcast_object(created, root_rank=0, name="elastic_test_dir"))
    yield directory
    hvd.barrier()
    if rank == 0:
        shutil.rmtree(directory)


def test_object_state_commit_restore_and_sync(rank, size):
    state = hvd.elastic.ObjectState(epoch=rank, history=[rank])
    assert state.epoch == rank
    state.epoch = 10 + rank
    state.history.append(99)
    state.restore()
    assert state.epoch == rank and state.history == [rank]
    state.epoch = 20 + rank
    state.commit()
    state.epoch = 0
    state.restore()
    assert state.epoch == 20 + rank
    state.sync()
    assert state.epoch == 20 and state.history == [0]


def test_torch_state_rolls_back_model_and_optimizer_and_syncs_from_rank_0(rank, size):
    torch.manual_seed(rank)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, optimizer, batch=rank)
    state.sync()
    reference = [p.detach().clone() for p in model.parameters()]
    assert all(torch.equal(t, hvd.broadcast(t, 0, name=f"ts.ref.{i}")) for i, t in enumerate(reference))
    assert state.batch == 0

    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    assert not torch.equal(next(model.parameters()), reference[0])
    state.restore()
    assert all(torch.equal(p, r) for p, r in zip(model.parameters(), reference, strict=True))
    assert all(not entry["momentum_buffer"].any() for entry in optimizer.state_dict()["state"].values())

    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    state.batch = 5
    state.commit()
    committed = [p.detach().clone() for p in model.parameters()]
    momentum = optimizer.state[next(model.parameters())]["momentum_buffer"].clone()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    optimizer.state[next(model.parameters())]["momentum_buffer"].zero_()
    state.batch = 6
    state.restore()
    assert all(torch.equal(p, c) for p, c in zip(model.parameters(), committed, strict=True))
    assert torch.equal(optimizer.state[next(model.parameters())]["momentum_buffer"], momentum)
    assert state.model is model and state.optimizer is optimizer and state.batch == 5


def test_elastic_sampler_partitions_and_skips_processed_samples(rank, size):
    dataset = list(range(23))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=3)
    assert len(sampler) == -(-23 // size)
    shards = hvd.allgather_object(list(sampler), name="sampler.shards")
    assert sorted(set().union(*map(set, shards))) == dataset
    assert all(len(shard) == len(sampler) for shard in shards)

    sampler.record_batch(0, 4)  # every rank processed its first batch of 4
    processed = set().union(*(shard[:4] for shard in shards))
    state = hvd.elastic.TorchState(sampler=sampler)
    state.sync()
    assert sampler.processed_num == 4 * size and sampler.state_dict() == {"epoch": 0, "processed_num": 4 * size}
    remaining = hvd.allgather_object(list(sampler), name="sampler.remaining")
    assert set().union(*map(set, remaining)) == set(dataset) - processed

    sampler.record_indices([list(set(dataset) - processed)[rank]])  # each rank marks one more index
    marked = set(hvd.allgather_object(sorted(sampler.processed_indices), name="sampler.marked")[0])
    state.sync()
    assert len(sampler.processed_indices) == size and marked <= sampler.processed_indices
    assert set().union(*map(set, hvd.allgather_object(list(sampler), name="sampler.after_marks"))).isdisjoint(
        sampler.processed_indices | processed)

    sampler.set_epoch(1)
    assert sampler.processed_num == 0 and sampler.processed_indices == set() and len(sampler) == -(-23 // size)
    other_order = hvd.allgather_object(list(sampler), name="sampler.epoch1")
    assert other_order != shards


def test_commit_persists_atomically_and_a_new_state_resumes_from_it(rank, size, shared_dir):
    directory = shared_dir / "checkpoints"
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(model, optimizer, checkpoint_dir=directory, sampler=sampler, epoch=0)
    state.sync()
    model(torch.randn(4, 4)).sum().backward()
    optimizer.step()
    sampler.record_batch(0, 2)
    state.epoch = 3
    state.commit()
    hvd.barrier()
    assert sorted(p.name for p in directory.iterdir()) == [CHECKPOINT_FILE]  # no temporary file left
    committed = [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(100 + rank)  # a restarted job: fresh model, optimizer and sampler on every rank
    fresh_model = _model()
    fresh_optimizer = torch.optim.SGD(fresh_model.parameters(), lr=0.5, momentum=0.9)
    fresh_sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    resumed = hvd.elastic.TorchState(fresh_model, fresh_optimizer, checkpoint_dir=directory,
                                     sampler=fresh_sampler, epoch=0)
    resumed.sync()
    assert resumed.epoch == 3
    assert all(torch.equal(p, c) for p, c in zip(fresh_model.parameters(), committed, strict=True))
    assert fresh_optimizer.param_groups[0]["lr"] == 0.1
    assert "momentum_buffer" in fresh_optimizer.state[next(fresh_model.parameters())]
    assert fresh_sampler.processed_num == 2 * size
    assert len(fresh_sampler) == -(-(10 - 2 * size) // size)


def test_checkpoint_of_another_state_is_refused(rank, size, shared_dir):
    directory = shared_dir / "other"
    hvd.elastic.ObjectState(checkpoint_dir=directory, epoch=1).commit()
    hvd.barrier()
    different = hvd.elastic.ObjectState(checkpoint_dir=directory, step=0)
    if rank == 0:
        with pytest.raises(RuntimeError, match="holds \\['epoch'\\]"):
            different.sync()
    hvd.barrier()


def test_run_outside_elastic_launch_returns_and_reraises_failures(rank, size):
    state = hvd.elastic.ObjectState(calls=0)

    @hvd.elastic.run
    def train(state, value):
        state.calls += 1
        return value * 2

    assert train(state, 21) == 42 and state.calls == 1

    @hvd.elastic.run
    def failing(state):
        raise hvd.HorovodInternalError("peer lost")

    with pytest.raises(hvd.HorovodInternalError, match="not an elastic launch"):
        failing(state)


def test_run_resets_on_host_update_and_rolls_back_on_failure(rank, size, monkeypatch):
    monkeypatch.setenv("TORCHRING_ELASTIC", "1")
    state = hvd.elastic.ObjectState(step=0, attempts=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        state.attempts += 1
        if state.attempts == 1:
            state.step = 1
            if hvd.rank() == 0:  # what an elastic launcher does when a host is added
                context.current().signed.set(HOSTS_VERSION_KEY, "1 added")
            hvd.barrier()
            state.commit()  # raises HostsUpdatedInterrupt on every rank
            pytest.fail("commit did not report the host update")
        if state.attempts == 2:
            state.step = 2
            state.commit()  # the update was seen: no interrupt
            state.step = 3
            raise hvd.HorovodInternalError("simulated peer failure")
        return state.step

    assert train(state) == 2  # rolled back to the commit made before the failure
    assert resets == [size, size]
    assert state.attempts == 3  # kept across the interrupt and the commit
    assert hvd.is_initialized()


def test_sync_is_skipped_only_when_every_rank_may_skip_it(rank):
    from torchring.elastic.reset_loop import _everyone_skips_sync

    assert _everyone_skips_sync(True) is True
    assert _everyone_skips_sync(False) is False
    assert _everyone_skips_sync(rank != 0) is False  # rank 0 must sync, so everyone does


def test_sync_takes_the_values_of_the_lowest_rank_that_trained_before_when_rank_0_is_new(rank, size):
    """A replacement worker that holds rank 0 must not hand its fresh values to the ranks that trained."""
    if size < 2:
        pytest.skip("needs a rank besides rank 0")
    trained = hvd.elastic.ObjectState(epoch=0)
    trained.sync()  # generation 0: everyone synced once
    if rank == 0:  # rank 0 is a new worker now: a state that never synced, with its initial values
        state = hvd.elastic.ObjectState(epoch=0)
    else:
        state, state.epoch = trained, 5 + rank
    state.sync()
    assert state.epoch == 6  # rank 1
    fresh = hvd.elastic.ObjectState(epoch=rank)
    fresh.sync()
    assert fresh.epoch == 0  # nobody trained before: rank 0's, as Horovod does


def test_sync_takes_the_values_of_the_rank_with_the_newest_commit(rank, size):
    """After a failure one survivor may have committed a step the others rolled back (the step's collective
    finished on it and failed on them): sync hands that newer commit to everyone, instead of rank 0's older
    one that would train the step, and count its samples, again; the newest count of commits is everyone's."""
    if size < 2:
        pytest.skip("needs a rank besides rank 0")
    state = hvd.elastic.ObjectState(step=0)
    state.sync()
    for step in (1, 2):
        state.step = step
        state.commit()
    if rank == size - 1:  # its step 3 completed; the others failed in it and rolled back to step 2
        state.step = 3
        state.commit()
    else:
        state.step = 3
        state.restore()
    state.sync()
    assert state.step == 3
    state.step = 4
    state.commit()
    if rank == 0:  # now rank 0 is ahead: its commit wins, whatever the last rank's history
        state.step = 5
        state.commit()
    else:
        state.restore()
    state.sync()
    assert state.step == 5
    state.restore()
    assert state.step == 5  # the values taken are committed
