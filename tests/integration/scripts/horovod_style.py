"""An unchanged Horovod script (the seed document's pattern), on synthetic data."""

import horovod
import horovod.torch as hvd
import torch
import torch.nn as nn
from horovod.torch.mpi_ops import synchronize

hvd.init()
model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
hvd_optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
generator = torch.Generator().manual_seed(hvd.rank())
for _ in range(5):
    data, target = torch.randn(16, 784, generator=generator), torch.randint(0, 10, (16,), generator=generator)
    optimizer.zero_grad()
    loss = nn.CrossEntropyLoss()(model(data), target)
    loss.backward()
    hvd_optimizer.step()
weights = hvd.allgather(model[0].weight.detach().reshape(1, -1))
assert all(torch.equal(row, weights[0]) for row in weights), "models diverged"
synchronize(hvd.allreduce_async(torch.ones(1)))
print(f"horovod {horovod.__version__} rank {hvd.rank()} of {hvd.size()} ok")
