"""A Horovod-style training loop across hosts: each rank prints its pid once it trains; the rank named by
``TR_STUCK_RANK`` then gets stuck in Python (as in a dead data loader) while the others wait for it."""

import os
import time

import torch

import torchring as hvd


def stuck_in_data_loading():
    time.sleep(600)


hvd.init()
stuck = int(os.environ.get("TR_STUCK_RANK", "-1"))
step = 0
while True:
    step += 1
    if step == 4 and hvd.rank() == stuck:
        stuck_in_data_loading()
    hvd.allreduce(torch.ones(4), name="grad")
    if step == 3:
        print(f"training rank={hvd.rank()} pid={os.getpid()}", flush=True)
    time.sleep(0.02)
