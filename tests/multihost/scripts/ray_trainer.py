"""A Ray Train TorchTrainer whose workers call hvd.init() (tests/multihost/test_ray.py): Ray has already made
the default process group; torchring joins its store. One line per worker."""

import sys

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    import socket

    import torch
    import torch.distributed as dist

    import torchring as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="trainer.probe")
    ones = torch.ones(1)
    dist.all_reduce(ones)  # Ray's own default group still works beside torchring's
    print(f"HVD rank={hvd.rank()} size={hvd.size()} sum={total.item():.0f} ddp={ones.item():.0f} "
          f"host={socket.gethostname()}", flush=True)
    hvd.shutdown()


ray.init(address="auto", logging_level="ERROR")
trainer = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
                       run_config=RunConfig(storage_path=sys.argv[1]))
result = trainer.fit()
print("FIT", "ok" if result.error is None else f"error {result.error!r}", flush=True)
