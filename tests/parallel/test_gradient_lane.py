"""DistributedOptimizer's bucket lane: after a negotiated first step the ranks reduce their buckets on
a group of their own; results must be exactly those of the negotiated path, join() must keep working."""

import os

import pytest
import torch
from torch import nn

import torchring as hvd


def make_model(seed: int = 7) -> nn.Module:
    torch.manual_seed(seed)
    # several small tensors (a shared bucket) and one of 1 MB or more (a bucket of its own)
    return nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 600), nn.ReLU(), nn.Linear(600, 3))


def batch(rank: int, step: int):
    generator = torch.Generator().manual_seed(rank * 1000 + step)
    return torch.randn(4, 16, generator=generator), torch.randint(0, 3, (4,), generator=generator)


def local_gradients(model: nn.Module, rank: int, step: int) -> list[torch.Tensor]:
    model.zero_grad()
    data, target = batch(rank, step)
    nn.functional.cross_entropy(model(data), target).backward()
    return [p.grad.clone() for p in model.parameters()]


def expected_gradients(rank: int, step: int, size: int, scale: float) -> list[torch.Tensor]:
    """Every rank's gradients of the same model at ``step``, summed, times ``scale``."""
    reference = make_model()
    per_rank = [local_gradients(reference, r, step) for r in range(size)]
    return [sum(grads[i] for grads in per_rank) * scale for i in range(len(per_rank[0]))]


def run_steps(optimizer, model, rank, steps, size, scale, set_to_none=True):
    """Reduce ``steps`` steps of gradients of a model that does not move (lr 0), checking each."""
    for step in range(steps):
        optimizer.zero_grad(set_to_none=set_to_none)
        data, target = batch(rank, step)
        nn.functional.cross_entropy(model(data), target).backward()
        optimizer.synchronize()
        for got, want in zip((p.grad for p in model.parameters()), expected_gradients(rank, step, size, scale),
                             strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        with optimizer.skip_synchronize():
            optimizer.step()


@pytest.mark.parametrize("op, scale_of_size", [(hvd.Average, lambda n: 1.0 / n), (hvd.Sum, lambda n: 1.0)])
def test_lane_opens_after_first_step_and_matches_negotiated_results(rank, size, op, scale_of_size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(), op=op)
    run_steps(optimizer, model, rank, 1, size, scale_of_size(size))
    assert optimizer._lane is not None
    run_steps(optimizer, model, rank, 4, size, scale_of_size(size))


@pytest.mark.parametrize("set_to_none", [True, False])
def test_reduced_gradients_are_slices_of_the_bucket_and_stay_right_step_after_step(rank, size, set_to_none):
    """Zero-copy buckets: after a step the small gradients are views into their bucket's flat buffer
    (nothing copied back); with set_to_none=False backward accumulates into that buffer itself."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters())
    run_steps(optimizer, model, rank, 4, size, 1.0 / size, set_to_none=set_to_none)
    small = [p for p in model.parameters() if p.numel() * p.element_size() < (1 << 20)]
    bases = {p.grad.untyped_storage().data_ptr() for p in small}
    assert len(small) >= 2 and len(bases) < len(small)  # several gradients share one buffer
    run_steps(optimizer, model, rank, 2, size, 1.0 / size, set_to_none=set_to_none)


def test_lane_with_predivide_factor_and_fp16_compression(rank, size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(), gradient_predivide_factor=2.0,
                                         compression=hvd.Compression.fp16)
    for step in range(4):
        optimizer.zero_grad()
        data, target = batch(rank, step)
        nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()
        for got, want in zip((p.grad for p in model.parameters()), expected_gradients(rank, step, size, 1.0 / size),
                             strict=True):
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
    assert optimizer._lane is not None


def test_training_on_the_lane_keeps_ranks_identical(rank):
    model = make_model(rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                         named_parameters=model.named_parameters())
    for step in range(6):
        optimizer.zero_grad()
        data, target = batch(rank, step)
        nn.functional.cross_entropy(model(data), target).backward()
        optimizer.step()
    assert optimizer._lane is not None
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.unsqueeze(0))
    for row in everyone[1:]:
        assert torch.equal(row, everyone[0])


def test_gradient_missing_on_one_rank_counts_as_zeros_on_the_lane(rank, size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    run_steps(optimizer, model, rank, 1, size, 1.0)
    assert optimizer._lane is not None
    optimizer.zero_grad()
    if rank == 0:  # the other ranks compute no gradient at all this step
        data, target = batch(rank, 50)
        nn.functional.cross_entropy(model(data), target).backward()
    optimizer.synchronize()
    for got, want in zip((p.grad for p in model.parameters()), local_gradients(make_model(), 0, 50), strict=True):
        torch.testing.assert_close(got, want)
    with optimizer.skip_synchronize():
        optimizer.step()


def test_join_while_other_ranks_train_on_the_lane(rank, size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    run_steps(optimizer, model, rank, 2, size, 1.0)
    assert optimizer._lane is not None
    # rank r trains r more steps, then joins: the others see its contribution as zeros
    for step in range(rank):
        optimizer.zero_grad()
        data, target = batch(rank, 100 + step)
        nn.functional.cross_entropy(model(data), target).backward()
        optimizer.synchronize()
        reference = make_model()
        still_training = [r for r in range(size) if r > step]
        want = [sum(grads) for grads in zip(*(local_gradients(reference, r, 100 + step) for r in still_training),
                                             strict=True)]
        for got, expected in zip((p.grad for p in model.parameters()), want, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        with optimizer.skip_synchronize():
            optimizer.step()
    assert hvd.join() == size - 1
    # the lane still works for everyone afterwards
    run_steps(optimizer, model, rank, 2, size, 1.0)


def test_the_rank_whose_last_lane_step_needed_the_others_zeros_joins_last(rank, size):
    """The order of joins follows what happened: a rank that still trained on the lane with the zeros of a
    rank that had joined joined after it. Rounds rotate which rank trains longest; while the first join is
    pending the engines keep cycling, so a joining rank's engine is often inside a cycle already."""
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(), op=hvd.Sum)
    run_steps(optimizer, model, rank, 1, size, 1.0)
    assert optimizer._lane is not None
    for round_ in range(2 * size):
        position = (rank + round_) % size  # this rank trains ``position`` more steps before it joins
        for step in range(position):
            optimizer.zero_grad()
            data, target = batch(rank, step)
            nn.functional.cross_entropy(model(data), target).backward()
            optimizer.synchronize()
            with optimizer.skip_synchronize():
                optimizer.step()
        assert hvd.join() == (size - 1 - round_) % size, f"round {round_}"


def test_a_rank_that_cannot_use_a_lane_keeps_everyone_negotiating(rank, size, monkeypatch):
    if rank == size - 1:
        monkeypatch.setenv("TORCHRING_GRADIENT_LANE", "0")
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters())
    run_steps(optimizer, model, rank, 3, size, 1.0 / size)
    assert optimizer._lane is None
    assert os.environ.get("TORCHRING_GRADIENT_LANE") == ("0" if rank == size - 1 else None)


def test_groups_stay_on_the_engine(rank, size):
    model = make_model()
    params = list(model.parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0),
                                         named_parameters=model.named_parameters(), groups=[params[:2]])
    run_steps(optimizer, model, rank, 2, size, 1.0 / size)
    assert optimizer._lane is None


class _Linear(nn.Module):
    """loss = sum(p * x_p): each parameter's gradient is exactly the chosen ``x_p``. Two small tensors share
    a bucket; the 1 MB one has a bucket of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.small_a = nn.Parameter(torch.zeros(5, 7))
        self.small_b = nn.Parameter(torch.zeros(13))
        self.big = nn.Parameter(torch.zeros(262_144))

    def loss(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return sum((param * inputs[name]).sum() for name, param in self.named_parameters())


def _exact_gradients(model: nn.Module, rank: int, predivide: float) -> dict[str, torch.Tensor]:
    """``predivide * m / 1024`` for integers ``|m| <= 682``: float16 holds them, prescaling by
    ``1 / predivide`` gives exactly ``m / 1024``, and any sum of three of those is exact too, so the
    backend's summation order cannot change the result; only averaging and postscaling round (and where
    they round shows which dtype they ran in). The rank offsets make the sums odd at 2 ranks and not
    multiples of 3 at 3 ranks, so that dividing by the size and postscaling do round."""
    gradients = {}
    for index, (name, param) in enumerate(model.named_parameters()):
        k = torch.arange(param.numel(), dtype=torch.float32).reshape(param.shape)
        gradients[name] = predivide * (((k * 7 + index * 3 + rank * 11 + rank * rank * 4) % 1365) - 682) / 1024.0
    return gradients


def _horovod_fp16_average(per_rank: list[torch.Tensor], prescale: float, postscale: float) -> torch.Tensor:
    """Horovod's formula: compress to float16, prescale, sum, divide by the size, postscale (all in
    float16, on the compressed tensor), then decompress."""
    wires = [g.to(torch.float16).mul_(prescale) for g in per_rank]
    total = wires[0].clone()
    for wire in wires[1:]:
        total.add_(wire)
    return total.div_(len(per_rank)).mul_(postscale).to(torch.float32)


@pytest.mark.parametrize("predivide", [1.0, 3.0])
def test_fp16_scaled_gradients_are_bitwise_the_same_on_the_engine_and_on_the_lane(rank, size, predivide):
    model = _Linear()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(), op=hvd.Average,
                                         gradient_predivide_factor=predivide, compression=hvd.Compression.fp16)
    per_rank = [_exact_gradients(model, r, predivide) for r in range(size)]
    want = {name: _horovod_fp16_average([grads[name] for grads in per_rank], 1.0 / predivide, predivide)
            for name in per_rank[0]}
    for step in range(3):  # step 0 is negotiated by the engine; the lane opens after it
        assert (optimizer._lane is not None) == (step > 0)
        optimizer.zero_grad()
        model.loss(per_rank[rank]).backward()
        optimizer.synchronize()
        for name, param in model.named_parameters():
            assert torch.equal(param.grad, want[name]), f"step {step}, {name}: {param.grad} != {want[name]}"
        with optimizer.skip_synchronize():
            optimizer.step()
