"""An unchanged Horovod loop (hvd.allreduce) that runs until the launcher stops it; each rank prints
its pid once it trains, so a test can SIGSTOP one."""

import os
import time

import horovod.torch as hvd
import torch

hvd.init()
step = 0
while True:
    step += 1
    hvd.allreduce(torch.ones(4), name="grad")
    if step == 3:
        print(f"training rank={hvd.rank()} pid={os.getpid()}", flush=True)
    time.sleep(0.02)
