"""An elastic job whose worker ``LANE_VICTIM`` (default w1) exits in its first step instead of launching
its first bucket's allreduce on DistributedOptimizer's gradient lane: the lane's groups connect a pair
of ranks on its first collective, so its peers' first allreduce waits on a pair to a process that is
gone. Fault injection in torchring's own code (the victim's ``GradientLane._launch``), nothing else.

With ``LANE_JOINER`` set, that worker calls ``hvd.join()`` after its first step instead (once, in the job's
first generation), so its first collective on the lane is a joined rank's step of zeros."""

import os
import sys
import time

import torch

import torchring as hvd
from torchring.runtime.dataplane import lane

if os.environ.get("TORCHRING_WORKER_ID") == os.environ.get("LANE_VICTIM", "w1"):

    def exit_instead(self, *args, **kwargs):
        time.sleep(float(os.environ.get("LANE_VICTIM_DELAY_S", "0")))
        print("exiting instead of launching the first bucket's allreduce", file=sys.stderr, flush=True)
        os._exit(1)

    lane.GradientLane._launch = exit_instead

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
joins_left = int(os.environ.get("TORCHRING_WORKER_ID") == os.environ.get("LANE_JOINER"))


@hvd.elastic.run
def train(state):
    global joins_left
    while state.step < 10:
        if joins_left and state.step == 1:
            joins_left = 0
            print("joining after the first step", file=sys.stderr, flush=True)
            hvd.join()
        optimizer.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        optimizer.step()
        state.step += 1
        state.commit()


train(state)
print(f"final rank {hvd.rank()} size {hvd.size()} step {state.step}", flush=True)
hvd.shutdown()
