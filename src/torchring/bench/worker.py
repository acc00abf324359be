"""What each rank of a ``torchring bench`` job runs: ``python -m torchring.bench.worker MODE OPTIONS``.

The rank joins torchring (``torchring.init()``) and also creates a plain gloo process group with
``env://`` (the launcher's store serves both), measures, and rank 0 writes the results as JSON to the
path the launcher chose. Both runtimes are shut down in order before the process exits.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

import torchring

from .collectives import run_collectives
from .options import CollectivesOptions, SmallOpsOptions, TrainOptions, decode
from .results import write_json_atomic
from .small_ops import run_small_ops
from .train import run_train


def metadata() -> dict[str, Any]:
    """Versions, world size, hosts and threads of this job (a collective: every rank calls it)."""
    return {
        "world_size": dist.get_world_size(),
        "hostnames": torchring.allgather_object(socket.gethostname(), name="bench.hostnames"),
        "torch_version": torch.__version__,
        "torchring_version": torchring.__version__,
        "python_version": platform.python_version(),
        "threads": torch.get_num_threads(),
        "backend": dist.get_backend(),
    }


def _log(message: str) -> None:
    if dist.get_rank() == 0:
        print(message, flush=True)


def _tear_down() -> None:
    torchring.shutdown()
    dist.barrier()
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m torchring.bench.worker {collectives,train,small-ops} OPTIONS_JSON", file=sys.stderr)
        return 2
    mode, payload = argv
    options, result_path = decode(mode, payload)
    if isinstance(options, SmallOpsOptions):  # each framework starts alone: its start-up is measured
        result = run_small_ops(options, lambda line: print(line, flush=True) if os.environ.get("RANK") == "0" else None)
        if os.environ.get("RANK") == "0":
            write_json_atomic(result_path, result)
        return 0
    torchring.init()
    dist.init_process_group("gloo", init_method="env://")
    if isinstance(options, CollectivesOptions):
        result = run_collectives(options, _log)
    else:
        assert isinstance(options, TrainOptions)
        result = run_train(options, _log)
    result["meta"] = metadata()
    if dist.get_rank() == 0:
        write_json_atomic(result_path, result)
    _tear_down()
    return 0


if __name__ == "__main__":
    code = main()
    # torch 2.13 can abort at interpreter exit after Gloo collectives ("terminate called without an
    # active exception"), even after an orderly teardown; everything is written, so leave directly.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
