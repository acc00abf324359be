"""A plain torch.distributed (Gloo) loop of all_reduce calls.

``stuck``: at step 3 rank 1 sleeps forever in ``load_batch`` before its all_reduce (the others wait in it).
``until FILE``: every rank goes on until rank 0 sees FILE, then all end with code 0."""

import os
import sys
import time

import torch
import torch.distributed as dist


def load_batch(step: int) -> torch.Tensor:
    if MODE == "stuck" and step == 3 and dist.get_rank() == 1:
        print("rank 1 stuck in load_batch", flush=True)
        time.sleep(3600)
    return torch.ones(4)


def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    step = 0
    while True:
        step += 1
        batch = load_batch(step)
        stop = torch.tensor([float(MODE == "until" and dist.get_rank() == 0 and os.path.exists(sys.argv[2]))])
        dist.all_reduce(batch)
        dist.all_reduce(stop)
        if step == 2:
            print(f"training rank={dist.get_rank()} pid={os.getpid()}", flush=True)
        if stop.item() > 0:
            print(f"done rank={dist.get_rank()}", flush=True)
            return
        time.sleep(0.02)


if __name__ == "__main__":
    MODE = sys.argv[1]
    main()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # see ddp_minimal.py: torch's Gloo teardown may abort at exit
