"""Collectives on CUDA tensors (NCCL group) with one GPU per rank; prints 'cuda ok' on success."""

import torch

import torchring as hvd

hvd.init()
torch.cuda.set_device(hvd.local_rank())
device = torch.device("cuda", hvd.local_rank())
rank, size = hvd.rank(), hvd.size()

summed = hvd.allreduce(torch.full((1024,), float(rank + 1), device=device), op=hvd.Sum)
assert summed.is_cuda and torch.equal(summed.cpu(), torch.full((1024,), float(sum(range(1, size + 1)))))
averaged = hvd.allreduce(torch.full((8,), float(rank), device=device, dtype=torch.float16))
assert averaged.dtype == torch.float16
gathered = hvd.allgather(torch.full((rank + 1, 3), float(rank), device=device))
assert gathered.shape == (sum(range(1, size + 1)), 3) and gathered.is_cuda
broadcast = hvd.broadcast(torch.full((5,), float(rank), device=device), root_rank=0)
assert torch.equal(broadcast.cpu(), torch.zeros(5))
in_place = torch.ones(4, device=device)
hvd.allreduce_(in_place, op=hvd.Sum)
assert torch.equal(in_place.cpu(), torch.full((4,), float(size)))

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
print(f"cuda ok rank={rank} size={size}")
