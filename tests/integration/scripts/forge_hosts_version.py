"""An elastic worker whose store gets a forged host-set version before its commit: training goes on."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

import torchring as hvd
from torchring.contract import HOSTS_VERSION_KEY, STORE_ADDR, STORE_PORT

hvd.init()
state = hvd.elastic.ObjectState(epoch=0)
attacker = dist.TCPStore(os.environ[STORE_ADDR], int(os.environ[STORE_PORT]), is_master=False,
                         timeout=timedelta(seconds=30))
for forged in (b"garbage", b"7 added"):
    attacker.set(HOSTS_VERSION_KEY, forged)
    hvd.allreduce(torch.ones(1), name=f"step{forged!r}")
    state.epoch += 1
    state.commit()  # would raise HostsUpdatedInterrupt (or crash parsing) if the forged value counted
print(f"COMMITTED {state.epoch}", flush=True)
