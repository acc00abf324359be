"""torchring.run from a script: a function defined in __main__ on 3 ranks, then one that fails."""

import json
import sys

import torchring


def allreduce_ranks(scale, offset=0):
    import socket

    import torch

    import torchring as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    return {"rank": hvd.rank(), "value": total * scale + offset, "host": socket.gethostname()}


if __name__ == "__main__":
    hosts = sys.argv[1] if len(sys.argv) > 1 else None
    results = torchring.run(allreduce_ranks, args=(2,), kwargs={"offset": 1}, np=3, hosts=hosts)
    print("RESULTS " + json.dumps(results), flush=True)
    try:
        torchring.run(lambda: 1 / 0, np=2, hosts=hosts)
    except torchring.launch.function_job.FunctionJobError as error:
        print(f"FAILED {error.exit_code}", flush=True)
