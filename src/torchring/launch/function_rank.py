"""What each rank of ``torchring.run(fn, ...)`` runs: fetch the function, call it, hand back the result.

The payload is unpickled only once its signature proves the job's launcher wrote it."""

from __future__ import annotations

import os
import sys
import traceback

import cloudpickle

from ..contract import FUNCTION_KEY, RANK, function_result_key
from .function_job import _environment_store


def main() -> int:
    store = _environment_store()
    rank = int(os.environ[RANK])
    payload = store.get(FUNCTION_KEY, max_bytes=0)
    if payload is None:
        print(f"torchring.run: rank {rank}: the function payload in the job's store ({FUNCTION_KEY!r}) is missing "
              "or not signed with the job's secret (another process replaced it); it was not unpickled",
              file=sys.stderr)
        return 1
    fn, args, kwargs = cloudpickle.loads(payload)
    try:
        result = fn(*args, **kwargs)
    except BaseException:  # noqa: BLE001 - reported on stderr, the launcher names this rank
        traceback.print_exc()
        return 1
    import torchring

    torchring.shutdown()  # a no-op unless the function initialised torchring; orderly on every rank
    store.set(function_result_key(rank), cloudpickle.dumps(result))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # results are in the store; skip torch's interpreter-exit teardown
