#!/usr/bin/env bash
# make gpu-check: the GPU tests and benchmarks/gpu_check.py at 2 ranks, with a python whose torch sees CUDA.
# Installs nothing from an index, so it runs on a machine without network access.
#
# The interpreter: $GPU_PYTHON if set, else .venv/bin/python when its torch sees CUDA, else python3; without
# a torch that sees a CUDA device it stops there, with one line saying so. Unless that interpreter is a
# virtual environment already (.venv, .venv-gpu or another, used as it is), .venv-gpu is made from it with
# --system-site-packages (its CUDA torch, pytest and scikit-learn are used from there) and torchring is
# installed into it offline and editable (pip install --no-index --no-deps --no-build-isolation -e .). Where
# no venv can be made (no ensurepip) or pip cannot install it, the interpreter runs torchring from src/
# through PYTHONPATH. torchring's launcher needs PyYAML; missing dependencies are installed from
# $GPU_CHECK_WHEELS (a directory of wheels) when given, else named.
#
# Steps, each run even when one before failed:
#   1. python -m pytest -m gpu tests/integration/test_gpu.py
#   2. python -m torchring run -np 2 python benchmarks/gpu_check.py $GPU_CHECK_ARGS
# Exit: 0 when both pass; 2 when the only failure is a missed performance target of gpu_check.py (its own
# exit 2); 1 otherwise, and 1 with a one-line reason when no interpreter has a torch that sees a CUDA device.
# Settings: GPU_PYTHON, GPU_CHECK_NP (default 2), GPU_CHECK_ARGS (more arguments of gpu_check.py),
# GPU_CHECK_WHEELS.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
fail() {
    echo "gpu-check: $*" >&2
    exit 1
}

# Prints one line: the torch and the devices it sees, or why it sees none (then exits 1).
CUDA_PROBE='
import sys
try:
    import torch
except Exception as error:
    print(f"{sys.executable} has no torch ({type(error).__name__}: {error})")
    sys.exit(1)
build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU build"
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} ({build}) of {sys.executable} sees no CUDA device")
    sys.exit(1)
count = torch.cuda.device_count()
print(f"torch {torch.__version__} ({build}) sees {count} CUDA device(s): {torch.cuda.get_device_name(0)}")
'

# ---- the interpreter -----------------------------------------------------------------------------------
if [ -n "${GPU_PYTHON:-}" ]; then
    PY=$GPU_PYTHON
    chosen_by="GPU_PYTHON"
elif [ -x .venv/bin/python ] && .venv/bin/python -c "$CUDA_PROBE" >/dev/null 2>&1; then
    PY=.venv/bin/python
    chosen_by=".venv"
else
    PY=$(command -v python3 || true)
    [ -n "$PY" ] || fail "no python3 on PATH (set GPU_PYTHON to a python whose torch sees CUDA)"
    chosen_by="python3 on PATH"
fi
if ! command -v "$PY" >/dev/null 2>&1; then
    fail "$PY ($chosen_by) is not an interpreter that can run"
fi
if ! torch_line=$("$PY" -c "$CUDA_PROBE" 2>/dev/null); then
    fail "${torch_line:-$PY ($chosen_by) could not run the torch probe} (set GPU_PYTHON to a python whose torch sees CUDA)"
fi

# ---- the virtual environment ---------------------------------------------------------------------------
from_source() {  # the fallback: the interpreter itself, with torchring from the source tree
    echo "gpu-check: $*; running torchring from $ROOT/src (PYTHONPATH) instead"
    VPY=$PY
    venv_line="none: $PY with PYTHONPATH=$ROOT/src"
    export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
}
prefix=$("$PY" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix else "")')
if [ -n "$prefix" ]; then
    VPY=$PY  # a virtual environment already (.venv, .venv-gpu, or the one GPU_PYTHON names): used as it is
    venv_line="$prefix (the interpreter's own)"
elif [ -x .venv-gpu/bin/python ] && .venv-gpu/bin/python -c "$CUDA_PROBE" >/dev/null 2>&1; then
    VPY=.venv-gpu/bin/python
    venv_line="$ROOT/.venv-gpu (made from $PY with its site packages)"
else
    rm -rf .venv-gpu
    if "$PY" -m venv --system-site-packages .venv-gpu >/dev/null 2>&1; then
        VPY=.venv-gpu/bin/python
        venv_line="$ROOT/.venv-gpu (made from $PY with its site packages)"
    else
        rm -rf .venv-gpu
        from_source "$PY -m venv --system-site-packages .venv-gpu failed (Debian/Ubuntu: no python3-venv)"
    fi
fi
if ! "$VPY" -c 'import sys, torchring; sys.exit(0 if torchring.__file__.startswith(sys.argv[1]) else 1)' \
        "$ROOT/src/" >/dev/null 2>&1; then
    echo "gpu-check: installing torchring (editable, offline) into $VPY"
    "$VPY" -m pip install --quiet --no-index --no-deps --no-build-isolation -e . \
        || from_source "could not install torchring into $VPY offline (pip's messages above; it needs setuptools>=64)"
fi
missing=$("$VPY" -c '
import importlib.util
names = {"yaml": "pyyaml", "cloudpickle": "cloudpickle", "tqdm": "tqdm", "prometheus_client": "prometheus-client"}
print(" ".join(dist for module, dist in names.items() if importlib.util.find_spec(module) is None))')
if [ -n "$missing" ] && [ -n "${GPU_CHECK_WHEELS:-}" ]; then
    echo "gpu-check: installing $missing from $GPU_CHECK_WHEELS (no index)"
    # shellcheck disable=SC2086  # one argument per distribution
    "$VPY" -m pip install --quiet --no-index --find-links "$GPU_CHECK_WHEELS" $missing \
        || fail "could not install $missing from $GPU_CHECK_WHEELS"
    missing=""
fi
case " $missing " in
    *" pyyaml "*) fail "torchring's launcher needs PyYAML, which $VPY cannot import: set GPU_CHECK_WHEELS to a" \
                       "directory with its wheel (pip download pyyaml on a machine with network)" ;;
esac
[ -z "$missing" ] || echo "gpu-check: not importable, and not needed by the check: $missing"

echo "gpu-check: interpreter $PY ($chosen_by); $torch_line"
echo "gpu-check: environment $venv_line"

# ---- the steps -----------------------------------------------------------------------------------------
NP=${GPU_CHECK_NP:-2}
read -r -a check_args <<<"${GPU_CHECK_ARGS:-}"
rows=()
status=0

run_step() {  # run_step NAME COMMAND...: runs it, notes its exit code and time
    local name=$1 started rc verdict
    shift
    echo "gpu-check: === $name: $*"
    started=$(date +%s)
    if "$@"; then rc=0; else rc=$?; fi
    verdict="passed"
    if [ "$rc" -ne 0 ]; then
        verdict="failed (exit $rc)"
        if [ "$name" = "gpu_check.py" ] && [ "$rc" -eq 2 ]; then
            verdict="values right, a performance target missed"
            [ "$status" -ne 0 ] || status=2
        else
            status=1
        fi
        [ "$name" != "gpu_check.py" ] || [ "$rc" -ne 1 ] || verdict="a value is WRONG (or a check raised)"
    fi
    rows+=("| $name | $rc | $(($(date +%s) - started)) | $verdict |")
}

run_step "pytest -m gpu" "$VPY" -m pytest -p no:cacheprovider -m gpu tests/integration/test_gpu.py
run_step "gpu_check.py" "$VPY" -m torchring run -np "$NP" "$VPY" benchmarks/gpu_check.py ${check_args[@]+"${check_args[@]}"}

echo
echo "gpu-check summary ($torch_line; $NP ranks)"
echo
echo "| step | exit | seconds | verdict |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
case $status in
    0) echo "gpu-check: passed" ;;
    2) echo "gpu-check: FAILED: a performance target was missed (values right)" ;;
    *) echo "gpu-check: FAILED" ;;
esac
exit "$status"
