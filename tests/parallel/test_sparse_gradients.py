"""Sparse gradients in DistributedOptimizer: allgathered and summed, or densified with sparse_as_dense.

Each rank looks up different (overlapping, partly repeated) rows of an ``nn.Embedding(sparse=True)``;
after every step all ranks hold the same weights, equal to a single-process reference that applies
the gradient of every rank's loss, averaged (or summed for ``op=Sum``).
"""

from collections.abc import Callable

import pytest
import torch
from torch import nn

import torchring as hvd

ROWS, DIM, LR = 12, 4, 0.05

LossFn = Callable[[nn.Module, int, int], torch.Tensor]


class SparseModel(nn.Module):
    """An embedding with sparse gradients followed by a small dense layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.embedding = nn.Embedding(ROWS, DIM, sparse=True)
        self.head = nn.Linear(DIM, 2)


def rank_rows(rank: int, step: int) -> torch.Tensor:
    """Rows this rank looks up: they overlap other ranks' rows and repeat one row."""
    return torch.tensor([rank, rank + 1, (3 * rank + step + 5) % ROWS, rank])


def embedding_loss(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    """A loss of the embedding alone, different on every rank and nonlinear in the weights."""
    rows = model.embedding(rank_rows(rank, step))
    weights = torch.linspace(0.5, 1.5, DIM) * (1.0 + 0.5 * rank)
    return ((rows * weights).sum(dim=1) ** 2).mean()


def model_loss(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    """The embedding followed by the dense layer."""
    return model.head(model.embedding(rank_rows(rank, step))).pow(2).mean()


def dense_only_loss_on_rank0(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    """From the second step on, rank 0 does not use the embedding: its gradient there is None."""
    if rank == 0 and step > 0:
        return model.head(torch.ones(1, DIM)).pow(2).mean()
    return model_loss(model, rank, step)


def train_distributed(tag: str, loss_fn: LossFn, rank: int, steps: int = 3, **options) -> tuple[nn.Module, list]:
    """Train on this rank's batches with DistributedOptimizer; return the model and each step's gradients."""
    model = SparseModel()
    named = [(f"{tag}.{name}", param) for name, param in model.named_parameters()]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), named_parameters=named,
                                         **options)
    passes = options.get("backward_passes_per_step", 1)
    gradients = []
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(passes):
            loss_fn(model, rank, step * passes + micro).backward()
        optimizer.step()
        gradients.append(model.embedding.weight.grad)
    return model, gradients


def train_reference(loss_fn: LossFn, size: int, scale: float, steps: int = 3,
                    passes: int = 1) -> tuple[nn.Module, list]:
    """One process applying the gradient of every rank's loss, multiplied by ``scale``."""
    model = SparseModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    gradients = []
    for step in range(steps):
        optimizer.zero_grad()
        for rank in range(size):
            for micro in range(passes):
                (loss_fn(model, rank, step * passes + micro) * scale).backward()
        optimizer.step()
        gradients.append(model.embedding.weight.grad)
    return model, gradients


def assert_identical_on_all_ranks(model: nn.Module) -> None:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0))
    for row in everyone[1:]:
        assert torch.equal(row, everyone[0])


def assert_matches_reference(model: nn.Module, reference: nn.Module) -> None:
    for mine, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, expected, atol=1e-5)


def assert_sparse_gradients_match(gradients: list, expected: list) -> None:
    for grad, reference in zip(gradients, expected, strict=True):
        assert grad.is_sparse and grad.is_coalesced()
        assert grad.shape == (ROWS, DIM)
        assert torch.allclose(grad.to_dense(), reference.to_dense(), atol=1e-5)


def assert_trained_like_reference(model, gradients: list, reference, expected: list) -> None:
    """Sparse gradients equal to the reference's, and the same model on every rank as the reference's."""
    assert_sparse_gradients_match(gradients, expected)
    assert_identical_on_all_ranks(model)
    assert_matches_reference(model, reference)


def test_sparse_gradients_are_averaged_as_sparse_tensors(rank, size):
    model, gradients = train_distributed("sparse_avg", embedding_loss, rank)
    reference, expected = train_reference(embedding_loss, size, scale=1.0 / size)
    assert_trained_like_reference(model, gradients, reference, expected)


def test_sparse_gradients_summed_with_op_sum(rank, size):
    model, gradients = train_distributed("sparse_sum", embedding_loss, rank, op=hvd.Sum)
    reference, expected = train_reference(embedding_loss, size, scale=1.0)
    assert_trained_like_reference(model, gradients, reference, expected)


def test_sparse_as_dense_reduces_dense_gradients(rank, size):
    """Reduced as dense tensors; as in Horovod, the optimizer then gets a sparse gradient again."""
    model, gradients = train_distributed("sparse_dense", embedding_loss, rank, sparse_as_dense=True)
    reference, expected = train_reference(embedding_loss, size, scale=1.0 / size)
    for grad, reference_grad in zip(gradients, expected, strict=True):
        assert grad.is_sparse
        assert torch.allclose(grad.to_dense(), reference_grad.to_dense(), atol=1e-5)
    assert_identical_on_all_ranks(model)
    assert_matches_reference(model, reference)


@pytest.mark.parametrize("options", [{"backward_passes_per_step": 2}, {"groups": 1}], ids=["passes2", "groups"])
def test_sparse_and_dense_parameters_together(rank, size, options):
    tag = "sparse_mixed_" + "_".join(options)
    model, gradients = train_distributed(tag, model_loss, rank, **options)
    passes = options.get("backward_passes_per_step", 1)
    reference, expected = train_reference(model_loss, size, scale=1.0 / size, passes=passes)
    assert_sparse_gradients_match(gradients, expected)
    assert not model.head.weight.grad.is_sparse
    assert_identical_on_all_ranks(model)
    assert_matches_reference(model, reference)


def test_rank_without_sparse_gradient_contributes_an_empty_one(rank, size):
    model, gradients = train_distributed("sparse_missing", dense_only_loss_on_rank0, rank)
    reference, expected = train_reference(dense_only_loss_on_rank0, size, scale=1.0 / size)
    assert_trained_like_reference(model, gradients, reference, expected)


def test_sparse_gradients_with_fp16_compression(rank, size):
    model, gradients = train_distributed("sparse_fp16", embedding_loss, rank, compression=hvd.Compression.fp16)
    reference, _ = train_reference(embedding_loss, size, scale=1.0 / size)
    assert all(grad.is_sparse and grad.dtype == torch.float32 for grad in gradients)
    assert_identical_on_all_ranks(model)
    for mine, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, expected, atol=1e-2)


@pytest.mark.parametrize("op", [hvd.Max, hvd.Min, hvd.Product])
def test_ops_other_than_average_and_sum_are_refused_for_sparse_gradients(size, op):
    if size == 1:
        pytest.skip("a job of one rank does not reduce gradients")
    embedding = SparseModel().embedding
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=LR), op=op,
                                         named_parameters=[(f"sparse_refused_{int(op)}.weight", embedding.weight)])
    with pytest.raises(ValueError, match=f"op={op.name.capitalize()} is not defined for sparse gradients"):
        embedding(torch.tensor([0, 1])).sum().backward()
        optimizer.step()


def test_sparse_as_dense_allows_max(rank, size):
    embedding = SparseModel().embedding
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=LR), op=hvd.Max,
                                         sparse_as_dense=True,
                                         named_parameters=[("sparse_dense_max.weight", embedding.weight)])
    embedding(torch.tensor([rank % ROWS])).sum().backward()
    optimizer.step()
    expected = torch.zeros(ROWS, DIM)
    expected[: min(size, ROWS)] = 1.0
    assert embedding.weight.grad.is_sparse and torch.equal(embedding.weight.grad.to_dense(), expected)
    assert_identical_on_all_ranks(embedding)
