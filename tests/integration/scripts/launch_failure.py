"""A collective whose launch fails after negotiation (a fault planted in this rank's executor, as an out-of-
memory error would raise there): first on every rank alike (each fails its own request; the job goes on),
then on rank 1 only (every rank must stop with one error naming rank 1, well before the 30 s Gloo timeout,
instead of rank 0 waiting in a collective rank 1 never joins). Prints one line per outcome."""

from __future__ import annotations

import time

import torch

import torchring as hvd
from torchring.runtime import context


def plant(names: set[str]) -> None:
    executor = context.current().engine.executor
    launch = executor.launch

    def failing_launch(response, request):  # noqa: ANN001, ANN202 - the executor's own signature
        if response.name in names:
            raise RuntimeError("CUDA out of memory (planted)")
        return launch(response, request)

    executor.launch = failing_launch


def main() -> None:
    hvd.init()
    rank = hvd.rank()
    plant({"allreduce.everyone"} | ({"allreduce.only_rank_1"} if rank == 1 else set()))
    try:
        hvd.allreduce(torch.ones(4), name="everyone")
        print("everyone: no error", flush=True)
    except RuntimeError as error:
        print(f"everyone: {type(error).__name__}: {error}", flush=True)
    print(f"after: {hvd.allreduce(torch.ones(4), name='after', op=hvd.Sum).tolist()}", flush=True)
    started = time.monotonic()
    try:
        hvd.allreduce(torch.ones(4), name="only_rank_1")
        print("only_rank_1: no error", flush=True)
    except hvd.HorovodInternalError as error:
        print(f"only_rank_1 after {time.monotonic() - started:.1f} s: {error}", flush=True)
    try:
        hvd.allreduce(torch.ones(4), name="later")
        print("later: no error", flush=True)
    except hvd.HorovodInternalError as error:
        print(f"later after {time.monotonic() - started:.1f} s: {error}", flush=True)


if __name__ == "__main__":
    main()
