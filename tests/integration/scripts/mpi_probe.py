"""An unchanged torchring script, as mpirun or srun starts it: one line per rank with what it learnt."""

import os
import socket
import sys

import torch

import torchring as hvd
from torchring.runtime import context

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="mpi.probe")
runtime = context.current()
secret_in_environment = any(name.endswith("JOB_SECRET") for name in os.environ)
# one write per line: mpirun relays each rank's output in chunks, and print() writes the newline apart
sys.stdout.write(f"PROBE rank={hvd.rank()} size={hvd.size()} local={hvd.local_rank()}/{hvd.local_size()} "
                 f"cross={hvd.cross_rank()}/{hvd.cross_size()} sum={total.item():.0f} via={runtime.environment.name} "
                 f"host={socket.gethostname()} "
                 f"signed={runtime.signed.credentials.authenticated} secret_in_env={secret_in_environment}\n")
sys.stdout.flush()
hvd.shutdown()
