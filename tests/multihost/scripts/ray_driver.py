"""A Ray driver for tests/multihost/test_ray.py: 2 hosts x 2 workers of RayExecutor, one JSON line per rank."""

import json
import sys

import ray

from torchring.ray import RayExecutor


def probe():
    import os
    import socket

    import torch

    import torchring as hvd
    from torchring.runtime import context

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="ray.probe")
    found = {"rank": hvd.rank(), "size": hvd.size(), "local": [hvd.local_rank(), hvd.local_size()],
             "cross": [hvd.cross_rank(), hvd.cross_size()], "sum": total.item(), "host": socket.gethostname(),
             "signed": context.current().signed.credentials.authenticated,
             "secret_in_env": any(name.endswith("JOB_SECRET") for name in os.environ)}
    hvd.shutdown()
    return found


class Model:
    def __init__(self, scale):
        self.scale = scale


ray.init(address="auto", logging_level="ERROR")
executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_hosts=2, num_workers_per_host=2,
                       cpus_per_worker=1)
executor.start(executable_cls=Model, executable_args=[3])
try:
    for result in executor.run(probe):
        print("RANK " + json.dumps(result), flush=True)
    print("SCALES " + json.dumps(executor.execute(lambda model: model.scale)), flush=True)
    print("SINGLE " + json.dumps(executor.execute_single(lambda model: model.scale * 2)), flush=True)
finally:
    executor.shutdown()
print("DONE", flush=True)
sys.exit(0)
