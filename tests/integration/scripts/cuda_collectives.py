"""Collectives on CUDA tensors, checked for values: one GPU per rank over NCCL, or (one GPU, several ranks)
every rank on GPU 0 over Gloo (``TORCHRING_CUDA_BACKEND=gloo``, set by the test). Prints 'cuda ok' on
success. Covers the engine's own stream (a collective while the training stream is busy), a fused burst,
fp16 averages, Min (an engine-path op), the optimizer's lane, and a rank that joins early: its zeros must
be made on its own GPU."""

import torch

import torchring as hvd

hvd.init()
index = hvd.local_rank() % torch.cuda.device_count()
torch.cuda.set_device(index)
device = torch.device("cuda", index)
rank, size = hvd.rank(), hvd.size()
total = float(sum(range(1, size + 1)))

summed = hvd.allreduce(torch.full((1024,), float(rank + 1), device=device), op=hvd.Sum)
assert summed.is_cuda and summed.device == device and torch.equal(summed.cpu(), torch.full((1024,), total))
averaged = hvd.allreduce(torch.full((8,), float(rank + 1), device=device, dtype=torch.float16))
assert averaged.dtype == torch.float16 and torch.equal(averaged.float().cpu(), torch.full((8,), total / size))
smallest = hvd.allreduce(torch.full((3,), float(rank + 5), device=device), op=hvd.Min)
assert torch.equal(smallest.cpu(), torch.full((3,), 5.0))
gathered = hvd.allgather(torch.full((rank + 1, 3), float(rank), device=device))
expected = torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)])
assert gathered.is_cuda and torch.equal(gathered.cpu(), expected)
broadcast = hvd.broadcast(torch.full((5,), float(rank), device=device), root_rank=size - 1)
assert torch.equal(broadcast.cpu(), torch.full((5,), float(size - 1)))
in_place = torch.ones(4, device=device)
hvd.allreduce_(in_place, op=hvd.Sum)
assert torch.equal(in_place.cpu(), torch.full((4,), float(size)))

# a fused burst while the training stream is busy: the engine's own stream waits only for these tensors
busy = torch.randn(4096, 4096, device=device)
for _ in range(4):
    busy = busy @ busy / 64.0
burst = [torch.full((256,), float(i + rank), device=device) for i in range(64)]
handles = [hvd.allreduce_async_(t, name=f"burst.{i}", op=hvd.Sum) for i, t in enumerate(burst)]
results = [hvd.synchronize(handle) for handle in handles]
for i, result in enumerate(results):
    assert torch.equal(result.cpu(), torch.full((256,), float(size * i + sum(range(size)))))
torch.cuda.synchronize()

model = torch.nn.Linear(16, 4).to(device)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(8, 16, device=device)).sum().backward()
    optimizer.step()
weights = hvd.allgather(model.weight.detach().reshape(1, -1))
assert all(torch.equal(row, weights[0]) for row in weights)

# the last rank joins at once; the others allreduce CUDA tensors it must answer with zeros on its GPU
if rank == size - 1:
    last = hvd.join()
else:
    joined_sum = hvd.allreduce(torch.ones(6, device=device), name="after_join", op=hvd.Sum)
    assert torch.equal(joined_sum.cpu(), torch.full((6,), float(size - 1)))
    last = hvd.join()
assert last in range(size)
print(f"cuda ok rank={rank} size={size}")
