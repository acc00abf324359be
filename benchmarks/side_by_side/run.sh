#!/bin/bash
# Alternate torchring (under `torchring run`) and the real Horovod (under `horovodrun --gloo`) on the
# same workloads, RUNS times each, 2 ranks on this host; one line per run.
#   benchmarks/side_by_side/run.sh HOROVOD_VENV [workload ...]     (default: burst latency mlp convnet)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
horovod_venv=${1:?usage: run.sh HOROVOD_VENV [workload ...]}
shift
workloads=${*:-burst latency mlp convnet}
torchring_python=${TORCHRING_PYTHON:-$root/.venv/bin/python}
for run in $(seq 1 "${RUNS:-3}"); do
  for workload in $workloads; do
    "$torchring_python" -m torchring run -np 2 "$torchring_python" "$here/workload.py" "$workload" 2>&1 | tail -1
    HOROVOD_API=1 PYTHONPATH="$root/src" "$horovod_venv/bin/horovodrun" --gloo -np 2 -H localhost:2 \
      "$horovod_venv/bin/python" "$here/workload.py" "$workload" 2>&1 | tail -1
  done
done
