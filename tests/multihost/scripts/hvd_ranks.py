"""A Horovod-style script: every rank reports its place and an allreduce across hosts, and its arguments."""

import json
import os
import socket
import sys

import torch

import torchring as hvd

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
                  "cross_rank": hvd.cross_rank(), "host": socket.gethostname(), "sum": total.item(),
                  "argv": sys.argv[1:], "env": os.environ.get("TR_TEST_VALUE"), "cwd": os.getcwd()}), flush=True)
mode = os.environ.get("TR_TEST_MODE", "")
if mode == "kill" and hvd.rank() == hvd.size() - 1:
    os.kill(os.getpid(), 9)
if mode in ("kill", "hang"):
    print("ready", flush=True)
    hvd.allreduce(torch.ones(1), name="never.completes.for.everyone" if mode == "kill" else "wait")
    import time
    time.sleep(600)
hvd.shutdown()
