"""DistributedOptimizer and the broadcast helpers: every rank ends with the same model."""

import warnings

import pytest
import torch
from torch import nn

import torchring as hvd


def make_model(seed_offset: int) -> nn.Module:
    torch.manual_seed(100 + seed_offset)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def gathered_parameters(model: nn.Module) -> torch.Tensor:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return hvd.allgather(flat.unsqueeze(0))


def assert_identical_on_all_ranks(model: nn.Module) -> None:
    everyone = gathered_parameters(model)
    for row in everyone[1:]:
        assert torch.equal(row, everyone[0])


def rank_batch(rank: int, batch: int = 5):
    generator = torch.Generator().manual_seed(rank)
    return torch.randn(batch, 6, generator=generator), torch.randint(0, 3, (batch,), generator=generator)


def train(model, optimizer, rank, steps=5):
    for step in range(steps):
        data, target = rank_batch(rank * 1000 + step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()


def test_broadcast_parameters_makes_models_equal(rank):
    model = make_model(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert_identical_on_all_ranks(model)
    reference = make_model(0)
    for mine, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, expected)


def test_training_keeps_parameters_identical_and_matches_averaged_gradients(rank, size):
    model = make_model(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    assert isinstance(optimizer, torch.optim.SGD)

    # a single-process reference trained on every rank's batch with averaged gradients
    reference = make_model(0)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(4):
        data, target = rank_batch(rank * 1000 + step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()
        reference_opt.zero_grad()
        for r in range(size):
            d, t = rank_batch(r * 1000 + step)
            (nn.functional.cross_entropy(reference(d), t) / size).backward()
        reference_opt.step()
    assert_identical_on_all_ranks(model)
    for mine, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, expected, atol=1e-5)


def test_parameter_without_gradient_on_one_rank_does_not_deadlock(rank, size):
    torch.manual_seed(7)
    shared, optional = nn.Linear(4, 4), nn.Linear(4, 4)
    params = list(shared.parameters()) + list(optional.parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=1.0),
                                         named_parameters=[(f"p{i}", p) for i, p in enumerate(params)])
    x = torch.ones(2, 4)
    out = shared(x)
    if rank == 0:
        out = optional(out)
    out.sum().backward()
    optimizer.step()
    assert optional.weight.grad is not None
    gathered = hvd.allgather(optional.weight.detach().reshape(1, -1))
    assert all(torch.equal(row, gathered[0]) for row in gathered)


def test_unnamed_parameters_are_allowed(rank):
    model = make_model(0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    train(model, optimizer, rank, steps=2)
    assert_identical_on_all_ranks(model)


def test_backward_passes_per_step_accumulates_locally(rank, size):
    model = make_model(0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters(), backward_passes_per_step=2)
    for step in range(2):
        optimizer.zero_grad()
        for micro in range(2):
            data, target = rank_batch(rank * 10 + micro + step)
            nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()
    assert_identical_on_all_ranks(model)
    optimizer.set_backward_passes_per_step(1)
    train(model, optimizer, rank, steps=1)
    assert_identical_on_all_ranks(model)


def test_fp16_compression_and_groups_train_consistently(rank):
    model = make_model(0)
    params = list(model.parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(params, lr=0.01), named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16, groups=[params[:2], params[2:]])
    train(model, optimizer, rank, steps=3)
    assert_identical_on_all_ranks(model)


def test_explicit_synchronize_then_skip_synchronize(rank):
    model = make_model(0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    data, target = rank_batch(rank)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(data), target).backward()
    optimizer.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with optimizer.skip_synchronize():
        optimizer.step()
    assert_identical_on_all_ranks(model)


def test_step_after_synchronize_without_skip_warns(rank):
    model = make_model(0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    data, target = rank_batch(rank)
    nn.functional.cross_entropy(model(data), target).backward()
    optimizer.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()
    assert any("skip_synchronize" in str(w.message) for w in caught)


def test_zero_grad_with_pending_allreduces_is_refused(rank):
    model = make_model(0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    data, target = rank_batch(rank)
    nn.functional.cross_entropy(model(data), target).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.step()


def test_named_parameters_validation():
    model = make_model(0)
    params = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("same", p) for _, p in params])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=params[:1])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[p for _, p in params])


def test_broadcast_optimizer_state_copies_state_and_typed_options(rank):
    model = make_model(0)
    lr = 0.001 * (rank + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.8 + 0.01 * rank, 0.999), amsgrad=rank == 0)
    if rank == 0:
        data, target = rank_batch(0)
        nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    group = optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(0.001) and isinstance(group["lr"], float)
    assert group["betas"] == (0.8, 0.999) and isinstance(group["betas"], tuple)
    assert group["amsgrad"] is True
    for param in model.parameters():
        state = optimizer.state[param]
        gathered = hvd.allgather(state["exp_avg"].reshape(1, -1))
        assert all(torch.equal(row, gathered[0]) for row in gathered)
        assert float(state["step"]) == 1.0


def test_broadcast_object_and_allgather_object(rank, size):
    obj = {"rank": rank, "payload": list(range(rank + 3)), "tensor": torch.ones(2) * rank}
    received = hvd.broadcast_object(obj if rank == 0 else None, root_rank=0)
    assert received["rank"] == 0 and received["payload"] == [0, 1, 2]
    assert torch.equal(received["tensor"], torch.zeros(2))
    everyone = hvd.allgather_object(("rank", rank, "x" * rank))
    assert everyone == [("rank", r, "x" * r) for r in range(size)]


def _embedding_indices(rank: int, step: int) -> torch.Tensor:
    """Rows looked up by ``rank`` at ``step``: some shared with other ranks, some its own."""
    return torch.tensor([(3 * rank + step) % 12, (rank + 2 * step) % 12, 5])


def _embedding_gradient(weight: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """The dense gradient of ``rank``'s loss at ``step`` for an embedding with ``weight``."""
    reference = nn.Embedding.from_pretrained(weight.detach().clone(), freeze=False)
    (reference(_embedding_indices(rank, step)) ** 2).sum().backward()
    return reference.weight.grad


@pytest.mark.parametrize("grouped", [False, True], ids=["buckets", "groups"])
def test_sparse_as_dense_gives_sparse_gradients_to_sparse_adam(rank, size, grouped):
    torch.manual_seed(21)
    embedding = nn.Embedding(12, 4, sparse=True)
    reference = nn.Embedding.from_pretrained(embedding.weight.detach().clone(), freeze=False, sparse=True)
    optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(embedding.parameters(), lr=0.1),
                                         named_parameters=embedding.named_parameters(), sparse_as_dense=True,
                                         groups=[[embedding.weight]] if grouped else None)
    expected_optimizer = torch.optim.SparseAdam(reference.parameters(), lr=0.1)
    for step in range(4):  # the first step on the engine, the later ones on the gradient lane (buckets)
        optimizer.zero_grad()
        (embedding(_embedding_indices(rank, step)) ** 2).sum().backward()
        optimizer.step()
        assert embedding.weight.grad.is_sparse
        # a single process stepping on the gradient averaged over ranks, made sparse like Horovod's
        averaged = sum(_embedding_gradient(reference.weight, r, step) for r in range(size)) / size
        reference.weight.grad = averaged.to_sparse(1)
        expected_optimizer.step()
        assert torch.allclose(embedding.weight, reference.weight, atol=1e-6), step
    assert (optimizer._lane is not None) is (not grouped)
    assert_identical_on_all_ranks(embedding)
