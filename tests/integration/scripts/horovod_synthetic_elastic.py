"""Horovod's pytorch_synthetic_benchmark_elastic.py in small (a tiny model instead of torchvision's, same
structure): warm-up, then timed iterations committed one by one in a TorchState, rank 0 logging."""

import sys
import timeit

import horovod.torch as hvd
import torch
import torch.nn as nn

NUM_ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
BATCH_SIZE, BATCHES_PER_ITER, WARMUP_BATCHES = 32, 5, 2

hvd.init()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
lr_scaler = hvd.size()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
data, target = torch.randn(BATCH_SIZE, 64), torch.randint(0, 10, (BATCH_SIZE,))


def benchmark_step(state):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()
    state.batch += 1


def log(message):
    if hvd.rank() == 0:
        print(message, flush=True)


@hvd.elastic.run
def run_benchmark(state):
    if not state.warm:
        log("Running warmup...")
        timeit.timeit(lambda: benchmark_step(state), number=WARMUP_BATCHES)
        state.warm = True
        state.commit()
    if state.iter == 0:
        log("Running benchmark...")
    for x in range(state.iter, NUM_ITERS):
        time = timeit.timeit(lambda: benchmark_step(state), number=BATCHES_PER_ITER)
        img_sec = BATCH_SIZE * BATCHES_PER_ITER / time
        log(f"Iter #{x}: {img_sec:.1f} img/sec per CPU")
        state.img_secs.append(img_sec)
        state.iter = x + 1
        state.commit()


def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group["lr"] = 0.01 * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, img_secs=[], iter=0, batch=0, warm=False)
state.register_reset_callbacks([on_state_reset])
run_benchmark(state)
log(f"Total img/sec on {hvd.size()} CPU(s): {sum(state.img_secs) / len(state.img_secs) * hvd.size():.1f}")
