"""Rank 1 exits with code 3 after init while the others wait in an allreduce; a DataLoader-like child
process of each rank keeps running, to check that whole process groups are terminated."""

import subprocess
import sys
import time

import torch

import torchring as hvd

hvd.init()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"rank {hvd.rank()} started child {child.pid}", flush=True)
hvd.barrier()
if hvd.rank() == 1:
    print("rank 1 failing on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
hvd.allreduce(torch.ones(2), name="never.completes")
time.sleep(600)
