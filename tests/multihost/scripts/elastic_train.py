"""Elastic training for the multi-host tests: a small model on 240 indexed samples, a commit after
every batch. Every rank appends, at each commit, every rank's samples of the batches since the previous
commit to ``$ELASTIC_LOG`` (so rolled-back batches are never logged), each batch keyed by the job-wide
sample count it ends at (readers keep one entry per key: the same batch from every rank, so that a rank
killed between its commit and its write loses nothing); at the end every rank prints a
checksum of its parameters. ``FAIL_ON_HOST=hN`` makes workers on that host exit 3 before init.
``ELASTIC_GROW_TO=N`` holds training after the fifth batch of the first epoch (committing, so that the
workers see host updates) until the job has N ranks, so that a host added then always joins in time."""

import json
import os
import socket
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import torchring as hvd

if os.environ.get("FAIL_ON_HOST") == socket.gethostname():
    print(f"failing on purpose on {socket.gethostname()}", file=sys.stderr, flush=True)
    sys.exit(3)

SAMPLES, BATCH, EPOCHS = 240, 4, int(os.environ.get("ELASTIC_EPOCHS", "3"))
STEP_SLEEP = float(os.environ.get("ELASTIC_STEP_SLEEP", "0.15"))
GROW_TO = int(os.environ.get("ELASTIC_GROW_TO", "0"))


class Indexed(Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return index, torch.randn(4, generator=generator), torch.tensor(float(index % 3))


hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(Indexed(), shuffle=True, seed=1)
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
pending: list[tuple[int, list[int]]] = []


def forget_uncommitted():
    pending.clear()


state.register_reset_callbacks([forget_uncommitted])


@hvd.elastic.run
def train(state):
    while state.epoch < EPOCHS:
        if state.sampler.epoch != state.epoch:
            state.sampler.set_epoch(state.epoch)
        loader = DataLoader(Indexed(), batch_size=BATCH, sampler=state.sampler)
        for batch_idx, (indices, data, target) in enumerate(loader):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data).squeeze(1), target)
            loss.backward()
            optimizer.step()
            everyone = hvd.allgather_object(indices.tolist(), name="elastic.indices")
            state.sampler.record_batch(batch_idx, BATCH)
            pending.append((state.sampler.processed_num, [index for part in everyone for index in part]))
            time.sleep(STEP_SLEEP)
            if hvd.rank() == 0:
                print(f"progress epoch {state.epoch} batch {batch_idx} size {hvd.size()}", flush=True)
            commit_and_log(state)
            while state.epoch == 0 and batch_idx >= 4 and hvd.size() < GROW_TO:
                time.sleep(STEP_SLEEP)
                state.commit()
        finished_epoch = state.epoch
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        commit_and_log(state, finished_epoch)


def commit_and_log(state, epoch=None):
    epoch = state.epoch if epoch is None else epoch
    batches = list(pending)
    try:
        state.commit()
    finally:
        # saved (commit may still raise HostsUpdatedInterrupt after saving): these batches count
        if batches:
            with open(os.environ["ELASTIC_LOG"], "a") as log:
                for key, batch in batches:
                    log.write(json.dumps({"epoch": epoch, "key": key, "indices": batch}) + "\n")
        pending.clear()


train(state)
checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
print(f"final rank {hvd.rank()} size {hvd.size()} checksum {checksum:.12f}", flush=True)
hvd.shutdown()
