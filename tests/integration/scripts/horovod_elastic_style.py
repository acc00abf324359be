"""An unchanged Horovod elastic script on synthetic data; prints where it started and ended."""

import sys

import horovod.torch as hvd
import horovod.torch.elastic  # noqa: F401  (scripts import it this way too)
import torch
import torch.nn as nn
from horovod.common.exceptions import HostsUpdatedInterrupt  # noqa: F401

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
hvd.init()
torch.manual_seed(0)
dataset = torch.utils.data.TensorDataset(torch.randn(64, 10), torch.randint(0, 2, (64,)))
model = nn.Linear(10, 2)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0, batch=0)
state.register_reset_callbacks([lambda: None])


@hvd.elastic.run
def train(state):
    print(f"rank {hvd.rank()} starts at epoch {state.epoch}", flush=True)
    for state.epoch in range(state.epoch, EPOCHS):  # noqa: B020 (Horovod's elastic idiom)
        state.sampler.set_epoch(state.epoch)
        for state.batch, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()
            state.sampler.record_batch(state.batch, 8)
            if state.batch % 2 == 0:
                state.commit()
        state.commit()
    return state.epoch


last = train(state)
weights = hvd.allgather(model.weight.detach().reshape(1, -1))
assert all(torch.equal(row, weights[0]) for row in weights), "models diverged"
print(f"rank {hvd.rank()} finished epoch {last}", flush=True)
