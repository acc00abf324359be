"""Init with a process set of ranks 0 and 1, an allreduce on the job and one on the set, shutdown, twice:
each time the reaper destroys every retired group at once (nothing else keeps one alive), so the process
does not wait for them at exit."""

import json
import time

import torch

import torchring as hvd
from torchring.runtime import group_reaper

report = []
for _ in range(2):
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    hvd.allreduce(torch.ones(1), name="settles.sum")
    if hvd.rank() < 2:
        hvd.allreduce(torch.ones(1), name="settles.pair_sum", process_set=pair)
    hvd.barrier()  # one rank's shutdown ends the job's pending operations: rank 2 waits for the pair's sum
    started = time.monotonic()
    hvd.shutdown()
    report.append({"settled": group_reaper.settle(2.0), "shutdown_s": round(time.monotonic() - started, 2)})
print(json.dumps(report))
