"""Adasum on every rank of a 4-rank job, and on process sets of 2 and 3 of its ranks, against the
single-process reference of the same rule (``adasum_reference``): one allreduce, a grouped allreduce
(fused, coefficients per tensor), fp16, and a few steps of ``DistributedOptimizer(op=Adasum)`` against the
reference of the updates. Prints ``ADASUM OK <checks>`` on every rank."""

import torch

import torchring as hvd
from torchring.runtime.dataplane.adasum import adasum_reference

PAIR, TRIPLE = hvd.ProcessSet([0, 1]), hvd.ProcessSet([0, 1, 2])
hvd.init(process_sets=[PAIR, TRIPLE])
assert hvd.size() == 4, "run with -np 4"
checks = 0


def data(rank, shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed * 100 + rank)).to(dtype)


for process_set, members in ((hvd.global_process_set, [0, 1, 2, 3]), (PAIR, [0, 1]), (TRIPLE, [0, 1, 2])):
    if hvd.rank() not in members:
        continue
    tag = f"n{len(members)}"
    mine = data(hvd.rank(), (5, 3), 1)
    result = hvd.allreduce(mine, op=hvd.Adasum, name=f"one.{tag}", process_set=process_set)
    expected = adasum_reference([data(r, (5, 3), 1) for r in members])
    torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-6)
    checks += 1

    shapes = [(4,), (2, 3), (7,)]
    tensors = [data(hvd.rank(), shape, 10 + i) for i, shape in enumerate(shapes)]
    results = hvd.grouped_allreduce(tensors, op=hvd.Adasum, name=f"group.{tag}", process_set=process_set)
    for i, shape in enumerate(shapes):
        reference = adasum_reference([data(r, shape, 10 + i) for r in members])
        torch.testing.assert_close(results[i], reference, rtol=1e-5, atol=1e-6)
    checks += 1

    half = data(hvd.rank(), (64,), 3, torch.float16)
    reduced = hvd.allreduce(half, op=hvd.Adasum, name=f"half.{tag}", process_set=process_set)
    reference = adasum_reference([data(r, (64,), 3, torch.float16).float() for r in members])
    assert reduced.dtype == torch.float16
    torch.testing.assert_close(reduced.float(), reference, rtol=2e-3, atol=2e-3)
    checks += 1

# DistributedOptimizer(op=Adasum): each rank steps on its own gradient, the updates are combined
model = torch.nn.Linear(3, 2)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(), op=hvd.Adasum)
for step in range(3):
    start = [p.detach().clone() for p in model.parameters()]
    updates = []
    for rank in range(hvd.size()):  # every rank's own SGD update, as the reference sees it
        inputs = data(rank, (8, 3), 20 + step)
        replica = torch.nn.Linear(3, 2)
        replica.load_state_dict(model.state_dict())
        replica(inputs).pow(2).mean().backward()
        updates.append([-0.1 * p.grad for p in replica.parameters()])
    optimizer.zero_grad()
    model(data(hvd.rank(), (8, 3), 20 + step)).pow(2).mean().backward()
    optimizer.step()
    for index, param in enumerate(model.parameters()):
        expected = start[index] + adasum_reference([u[index] for u in updates])
        torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=1e-6)
    checks += 1

print(f"ADASUM OK {checks}", flush=True)
