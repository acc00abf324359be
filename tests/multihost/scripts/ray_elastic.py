"""An elastic Ray driver for tests/multihost/test_ray.py: ``ElasticRayExecutor`` trains on every slot of the
cluster until the file ``FINISH`` exists; rank 0 keeps ``PROGRESS`` (JSON: step, size) up to date, and the
driver prints one ``RESULT`` JSON line per worker that completed.

    python ray_elastic.py PROGRESS FINISH
"""

import json
import sys

import ray

from torchring.ray import ElasticRayExecutor

PROGRESS, FINISH = sys.argv[1], sys.argv[2]


def train():
    import os
    import socket
    import time

    import torch

    import torchring as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, sizes=[])

    @hvd.elastic.run
    def loop(state):
        while True:
            generator = torch.Generator().manual_seed(state.step * 100 + hvd.rank())
            data = torch.randn(8, 4, generator=generator)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(data).squeeze(1), data.sum(1)).backward()
            optimizer.step()
            state.step += 1
            if not state.sizes or state.sizes[-1] != hvd.size():
                state.sizes.append(hvd.size())
            done = hvd.broadcast_object(os.path.exists(FINISH), root_rank=0, name="finish")
            if hvd.rank() == 0:
                with open(PROGRESS + ".tmp", "w") as out:
                    json.dump({"step": state.step, "size": hvd.size()}, out)
                os.replace(PROGRESS + ".tmp", PROGRESS)
            time.sleep(0.05)  # the pace of a real step, so that the test can act between two
            state.commit()
            if done:
                return

    loop(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "sizes": state.sizes,
            "host": socket.gethostname(), "weights": [p.detach().flatten().tolist() for p in model.parameters()]}


ray.init(address="auto", logging_level="ERROR")
executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, elastic_timeout=60,
                                                                 verbose=True), cpus_per_slot=1)
executor.start()
try:
    for result in executor.run(train):
        print("RESULT " + json.dumps(result), flush=True)
finally:
    executor.shutdown()
print(f"RESETS {executor.driver.resets}", flush=True)
