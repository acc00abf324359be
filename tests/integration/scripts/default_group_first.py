"""The default group first, then torchring (see tests/integration/test_default_group_first.py)."""

import torch
import torch.distributed as dist

import torchring as hvd

dist.init_process_group("gloo")
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="first")
ones = torch.ones(1)
dist.all_reduce(ones)
hvd.shutdown()
hvd.init()  # a re-init joins the same store again
again = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="again")
print(f"rank {hvd.rank()} size {hvd.size()} torchring-sum {total.item():.0f} default-group-sum {ones.item():.0f} "
      f"reinit-sum {again.item():.0f}", flush=True)
hvd.shutdown()
dist.destroy_process_group()
