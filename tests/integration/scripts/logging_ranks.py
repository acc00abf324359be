"""Logs from every rank with a rank-0 logger and an all-ranks logger, before and after ``init()``."""

import torch

import torchring as hvd
from torchring.logging_utils import get_logger, progress

log = get_logger("demo")
log_all = get_logger("demo.all", all_ranks=True)
get_logger("demo")  # a second call must not duplicate the handler

log.info("before init (rank-0 logger)")
log_all.info("before init (all-ranks logger)")

hvd.init()
total = hvd.allreduce(torch.tensor(float(hvd.rank())), op=hvd.Sum).item()
log.info("after init: rank %d of %d, sum of ranks %g", hvd.rank(), hvd.size(), total)
log_all.warning("after init: rank %d says hello", hvd.rank())
for _ in progress(range(3), desc="demo loop", batch_size=2, min_interval_s=0):
    pass
hvd.shutdown()
