"""SyncBatchNorm against torch's BatchNorm run in one process on the concatenation of all ranks' batches.

Every rank builds every rank's batch from seeded generators (rank r has r + 2 samples, so batch sizes
differ), hence each rank can compute the single-process reference locally and compare its own slice.

Gradients: the loss of the job is ``L = sum over ranks r of (output_r * w_r).sum()`` with fixed
per-rank weights ``w_r``. The reference computes ``L`` on the concatenated batch in one process.

* input: each rank's ``input.grad`` equals dL/d(input_r), the reference input gradient's slice r;
* weight and bias: each rank holds its share, ``sum over its samples of dL/d(output_r) * normalized_r``
  (weight) and ``sum of dL/d(output_r)`` (bias); the shares summed over ranks equal dL/dweight and
  dL/dbias. ``DistributedOptimizer`` averages them, giving dL/dweight / size, the same scale as every
  other parameter's averaged gradient (``test_distributed_optimizer_step_matches_reference`` checks it).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchring as hvd
from torchring.sync_batch_norm import SyncBatchNorm

CHANNELS = 3
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
LAYOUTS = {
    "N,C": (nn.BatchNorm1d, ()),
    "N,C,L": (nn.BatchNorm1d, (5,)),
    "N,C,H,W": (nn.BatchNorm2d, (4, 3)),
    "N,C,D,H,W": (nn.BatchNorm3d, (2, 3, 2)),
}


def batch_size(rank: int) -> int:
    return rank + 2


def all_batches(size: int, spatial: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32):
    """Every rank's batch (rank r: r + 2 samples), with a large mean to exercise numerical stability."""
    batches = []
    for r in range(size):
        generator = torch.Generator().manual_seed(1000 * seed + r)
        sample = torch.randn(batch_size(r), CHANNELS, *spatial, generator=generator, dtype=torch.float64)
        batches.append((sample * 2 + 10).to(dtype))
    return batches


def loss_weights(size: int, spatial: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    """The fixed w_r of the loss sum_r (output_r * w_r).sum()."""
    generator = torch.Generator().manual_seed(7000 + seed)
    return [torch.randn(batch_size(r), CHANNELS, *spatial, generator=generator) for r in range(size)]


def rows_of(rank: int) -> slice:
    start = sum(batch_size(r) for r in range(rank))
    return slice(start, start + batch_size(rank))


def make_pair(reference_cls: type[nn.Module], **kwargs) -> tuple[SyncBatchNorm, nn.Module]:
    """A SyncBatchNorm and a torch BatchNorm with the same (non-trivial) affine parameters."""
    sync, reference = SyncBatchNorm(CHANNELS, **kwargs), reference_cls(CHANNELS, **kwargs)
    if sync.affine:
        with torch.no_grad():
            for module in (sync, reference):
                module.weight.copy_(torch.tensor([0.5, 2.0, -1.5]))
                module.bias.copy_(torch.tensor([0.1, -0.3, 1.2]))
    return sync, reference


def run_both(sync: nn.Module, reference: nn.Module, mine: torch.Tensor, batches: list[torch.Tensor],
             weights: list[torch.Tensor], rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward and weighted backward of this rank's ``mine`` through ``sync`` and of every rank's batches
    through ``reference``; returns (sync output, reference output, the reference's input)."""
    output = sync(mine)
    (output * weights[rank]).sum().backward()
    everyone = torch.cat(batches).requires_grad_(True)
    expected = reference(everyone)
    (expected * torch.cat(weights)).sum().backward()
    return output, expected, everyone


def assert_same_buffers(sync: nn.Module, reference: nn.Module) -> None:
    torch.testing.assert_close(sync.running_mean, reference.running_mean, **TOLERANCE)
    torch.testing.assert_close(sync.running_var, reference.running_var, **TOLERANCE)
    assert torch.equal(sync.num_batches_tracked, reference.num_batches_tracked)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_forward_and_running_stats_match_reference(rank, size, layout, momentum):
    reference_cls, spatial = LAYOUTS[layout]
    sync, reference = make_pair(reference_cls, momentum=momentum)
    for step in range(3):
        batches = all_batches(size, spatial, seed=step)
        output = sync(batches[rank])
        expected = reference(torch.cat(batches))[rows_of(rank)]
        assert output.shape == batches[rank].shape
        torch.testing.assert_close(output, expected, **TOLERANCE)
        assert_same_buffers(sync, reference)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gradients_match_reference(rank, size, layout, affine):
    reference_cls, spatial = LAYOUTS[layout]
    sync, reference = make_pair(reference_cls, affine=affine)
    batches, weights = all_batches(size, spatial, seed=11), loss_weights(size, spatial, seed=11)

    mine = batches[rank].clone().requires_grad_(True)
    _, _, everyone = run_both(sync, reference, mine, batches, weights, rank)

    torch.testing.assert_close(mine.grad, everyone.grad[rows_of(rank)], **TOLERANCE)
    if not affine:
        return
    reduce_dims = [d for d in range(mine.dim()) if d != 1]
    normalized = F.batch_norm(torch.cat(batches), None, None, training=True, eps=sync.eps)[rows_of(rank)]
    weight_share = (weights[rank] * normalized).sum(dim=reduce_dims)
    bias_share = weights[rank].sum(dim=reduce_dims)
    torch.testing.assert_close(sync.weight.grad, weight_share, **TOLERANCE)
    torch.testing.assert_close(sync.bias.grad, bias_share, **TOLERANCE)
    torch.testing.assert_close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad, **TOLERANCE)
    torch.testing.assert_close(hvd.allreduce(sync.bias.grad, op=hvd.Sum), reference.bias.grad, **TOLERANCE)


def test_float64_matches_reference_tightly(rank, size):
    sync, reference = make_pair(nn.BatchNorm2d)
    sync.double()
    reference.double()
    spatial = LAYOUTS["N,C,H,W"][1]
    batches = all_batches(size, spatial, seed=21, dtype=torch.float64)
    weights = [w.double() for w in loss_weights(size, spatial, seed=21)]

    mine = batches[rank].clone().requires_grad_(True)
    output, expected, everyone = run_both(sync, reference, mine, batches, weights, rank)

    assert output.dtype == torch.float64
    torch.testing.assert_close(output, expected[rows_of(rank)])
    torch.testing.assert_close(mine.grad, everyone.grad[rows_of(rank)])
    torch.testing.assert_close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad)
    assert_same_buffers(sync, reference)


def test_bfloat16_input_is_normalized_in_float32(rank, size):
    sync, reference = make_pair(nn.BatchNorm2d)
    spatial = LAYOUTS["N,C,H,W"][1]
    batches = all_batches(size, spatial, seed=31, dtype=torch.bfloat16)
    output = sync(batches[rank])
    expected = reference(torch.cat(batches).float())[rows_of(rank)]
    assert output.dtype == torch.bfloat16
    torch.testing.assert_close(output.float(), expected, rtol=2e-2, atol=2e-2)
    assert_same_buffers(sync, reference)


def test_channels_last_input(rank, size):
    sync, reference = make_pair(nn.BatchNorm2d)
    spatial = LAYOUTS["N,C,H,W"][1]
    batches, weights = all_batches(size, spatial, seed=41), loss_weights(size, spatial, seed=41)
    mine = batches[rank].contiguous(memory_format=torch.channels_last).requires_grad_(True)
    output, expected, everyone = run_both(sync, reference, mine, batches, weights, rank)
    torch.testing.assert_close(output, expected[rows_of(rank)], **TOLERANCE)
    torch.testing.assert_close(mine.grad, everyone.grad[rows_of(rank)], **TOLERANCE)


def make_model(norm: type[nn.Module]) -> nn.Sequential:
    torch.manual_seed(90)
    return nn.Sequential(nn.Linear(6, CHANNELS), norm(CHANNELS), nn.ReLU(), nn.Linear(CHANNELS, 2))


def test_distributed_optimizer_step_matches_reference(rank, size):
    """DistributedOptimizer averages gradients: a step is the reference's step on L / size."""
    model = make_model(SyncBatchNorm)
    reference = make_model(nn.BatchNorm1d)
    reference.load_state_dict(model.state_dict())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    inputs = [torch.randn(batch_size(r), 6, generator=torch.Generator().manual_seed(95 + r)) for r in range(size)]
    weights = [torch.randn(batch_size(r), 2, generator=torch.Generator().manual_seed(99 + r)) for r in range(size)]

    for _ in range(2):
        optimizer.zero_grad()
        (model(inputs[rank]) * weights[rank]).sum().backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        ((reference(torch.cat(inputs)) * torch.cat(weights)).sum() / size).backward()
        reference_optimizer.step()

    for (name, mine), expected in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(mine, expected, **TOLERANCE, msg=name)


def test_weight_gradient_without_input_gradient(rank, size):
    sync, reference = make_pair(nn.BatchNorm1d)
    batches, weights = all_batches(size, (), seed=51), loss_weights(size, (), seed=51)
    (sync(batches[rank]) * weights[rank]).sum().backward()
    (reference(torch.cat(batches)) * torch.cat(weights)).sum().backward()
    torch.testing.assert_close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad, **TOLERANCE)
    torch.testing.assert_close(hvd.allreduce(sync.bias.grad, op=hvd.Sum), reference.bias.grad, **TOLERANCE)


def test_rank_with_empty_batch(rank, size):
    if size == 1:
        pytest.skip("needs another rank with samples")
    sync, reference = make_pair(nn.BatchNorm1d)
    batches, weights = all_batches(size, (4,), seed=55), loss_weights(size, (4,), seed=55)
    batches[0], weights[0] = batches[0][:0], weights[0][:0]
    starts = [0, *torch.tensor([len(b) for b in batches]).cumsum(0).tolist()]
    mine = batches[rank].clone().requires_grad_(True)
    output, expected, everyone = run_both(sync, reference, mine, batches, weights, rank)
    rows = slice(starts[rank], starts[rank + 1])
    torch.testing.assert_close(output, expected[rows], **TOLERANCE)
    torch.testing.assert_close(mine.grad, everyone.grad[rows], **TOLERANCE)
    torch.testing.assert_close(hvd.allreduce(sync.weight.grad, op=hvd.Sum), reference.weight.grad, **TOLERANCE)
    assert_same_buffers(sync, reference)


def test_eval_uses_running_stats(rank, size):
    sync, reference = make_pair(nn.BatchNorm2d)
    spatial = LAYOUTS["N,C,H,W"][1]
    for step in range(2):
        batches = all_batches(size, spatial, seed=60 + step)
        sync(batches[rank])
        reference(torch.cat(batches))
    sync.eval()
    reference.eval()
    # in eval mode ranks run no collective, so each may normalize a batch of its own shape
    local = all_batches(size, (rank + 1, 2), seed=70)[rank]
    expected = F.batch_norm(local, reference.running_mean, reference.running_var, reference.weight,
                            reference.bias, training=False, eps=reference.eps)
    torch.testing.assert_close(sync(local), expected, **TOLERANCE)
    torch.testing.assert_close(sync(local), reference(local), **TOLERANCE)
    assert_same_buffers(sync, reference)


def test_without_running_stats(rank, size):
    sync, reference = make_pair(nn.BatchNorm1d, track_running_stats=False)
    assert sync.running_mean is None and sync.num_batches_tracked is None
    batches = all_batches(size, (4,), seed=80)
    expected = reference(torch.cat(batches))[rows_of(rank)]
    torch.testing.assert_close(sync(batches[rank]), expected, **TOLERANCE)
    # eval without running stats normalizes with this rank's own batch, like torch's BatchNorm
    sync.eval()
    reference.eval()
    torch.testing.assert_close(sync(batches[rank]), reference(batches[rank]), **TOLERANCE)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(), (CHANNELS,)])
def test_input_without_channel_dimension_is_rejected(training, shape):
    sync = SyncBatchNorm(CHANNELS).train(training)
    with pytest.raises(ValueError, match="expected at least 2D input"):
        sync(torch.randn(shape))
