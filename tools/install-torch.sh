#!/usr/bin/env bash
# Install torch VERSION of the chosen BUILD into the environment of PYTHON, saying which and from where.
#
#   tools/install-torch.sh PYTHON VERSION [BUILD]
#
# BUILD: cpu (the default: the CPU build, about 200 MB, from a wheel pip already finds, else from
# PyTorch's CPU index), cuda (the CUDA build from the Python index: several GB with its nvidia-*
# packages), or pip (whatever `pip install torch==VERSION` resolves, e.g. on macOS). A torch of that
# version and build already installed is kept.
set -euo pipefail
python=$1 version=$2 build=${3:-cpu}
cpu_index=https://download.pytorch.org/whl/cpu

installed() {  # the installed torch's version and build, as "2.13.0+cpu cpu" or "2.13.0 cuda"; empty if none
    "$python" - <<'PY' 2>/dev/null || true
import importlib.metadata as metadata
try:
    version = metadata.version("torch")
except metadata.PackageNotFoundError:
    raise SystemExit(0)
cuda = any(name.startswith(("nvidia-cuda-runtime", "nvidia-cudnn")) for name in
           (dist.metadata["Name"] or "" for dist in metadata.distributions()))
print(version, "cuda" if cuda or "+cu" in version else "cpu")
PY
}

case "$build" in
    cpu|cuda|pip) ;;
    *) echo "install-torch: TORCH_BUILD must be cpu, cuda or pip, not '$build'" >&2; exit 2 ;;
esac
read -r have_version have_build <<<"$(installed)" || true
if [ "${have_version%%+*}" = "$version" ] && { [ "$build" = pip ] || [ "$have_build" = "$build" ]; }; then
    echo "torch $have_version ($have_build build) is already installed"
    exit 0
fi
case "$build" in
    cpu)
        echo "installing torch $version, CPU build (about 200 MB; TORCH_BUILD=cuda for the CUDA build)"
        # a CPU wheel pip already finds (a local wheel directory or mirror) first, then PyTorch's CPU index
        if ! "$python" -m pip install --quiet "torch==$version+cpu" 2>/dev/null; then
            echo "  from $cpu_index"
            "$python" -m pip install --progress-bar on "torch==$version+cpu" --extra-index-url "$cpu_index" || {
                echo "install-torch: no CPU build of torch $version could be installed (is $cpu_index reachable?);" \
                     "TORCH_BUILD=pip installs whatever pip finds for torch==$version" >&2
                exit 1
            }
        fi ;;
    cuda)
        echo "installing torch $version, CUDA build from the Python index (several GB with its nvidia-* packages)"
        "$python" -m pip install --progress-bar on "torch==$version" ;;
    pip)
        echo "installing torch $version as pip resolves it (TORCH_BUILD=pip)"
        "$python" -m pip install --progress-bar on "torch==$version" ;;
esac
read -r have_version have_build <<<"$(installed)" || true
echo "installed torch $have_version ($have_build build)"
