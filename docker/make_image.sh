#!/usr/bin/env bash
# `make image`: builds torchring's CPU image (docker/Dockerfile.cpu) on machines with and without access to
# image registries and PyTorch's index (see docker/README.md):
#
# 1. The base: BASE_IMAGE (python:3.11-slim) if present or pullable; otherwise the local Debian base
#    LOCAL_BASE (torchring-base:bookworm), built once by docker/make_base_image.sh (debootstrap, root).
# 2. Wheels: with WHEELHOUSE=1 (or WHEELHOUSE=auto, the default, when the host cannot reach
#    TORCH_INDEX_URL) `pip download` fills docker/wheelhouse with torch, torchring's dependencies and
#    its build backend, for the image's Python (PYTHON_VERSION, 3.11) on this machine's architecture,
#    through the host's own pip configuration; the build then needs no network. WHEELHOUSE=0: the indexes.
# 3. `docker build` of IMAGE (torchring:cpu), then its size and how long each step took.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-torchring:cpu}
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
LOCAL_BASE=${LOCAL_BASE:-torchring-base:bookworm}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
WHEELHOUSE=${WHEELHOUSE:-auto}
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
PYTHON=${PYTHON:-python3}
PULL_TIMEOUT_S=${PULL_TIMEOUT_S:-120}
WHEELS=docker/wheelhouse

say() { echo "make image: $*"; }
fail() { echo "make image: $*" >&2; exit 1; }

docker info >/dev/null 2>&1 || fail "no Docker Engine answers: start dockerd (or Docker Desktop), or check DOCKER_HOST"
started=$(date +%s)

# ---- 1. the base image
if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    base=$BASE_IMAGE
    say "base image $base (present)"
elif say "pulling $BASE_IMAGE" && timeout "$PULL_TIMEOUT_S" docker pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    base=$BASE_IMAGE
else
    base=$LOCAL_BASE
    if docker image inspect "$base" >/dev/null 2>&1; then
        say "cannot pull $BASE_IMAGE: using the local Debian base $base (built earlier)"
    else
        say "cannot pull $BASE_IMAGE: building the local Debian base $base (docker/make_base_image.sh)"
        docker/make_base_image.sh "$base"
    fi
fi

# ---- 2. wheels for a build without network
if [ "$WHEELHOUSE" = auto ]; then
    if "$PYTHON" - "$TORCH_INDEX_URL" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).close()
PY
    then WHEELHOUSE=0; else WHEELHOUSE=1; say "cannot reach $TORCH_INDEX_URL from this machine"; fi
fi
if [ "$WHEELHOUSE" = 1 ]; then
    requirements=$("$PYTHON" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
wanted = project["project"]["dependencies"] + project["project"]["optional-dependencies"]["examples"]
print("\n".join(wanted + project["build-system"]["requires"] + ["wheel"]))
PY
)
    arch=$(uname -m)
    say "downloading torch==$TORCH_VERSION and torchring's dependencies for Python $PYTHON_VERSION ($arch) into $WHEELS"
    mapfile -t wanted <<<"$requirements"
    "$PYTHON" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: \
        --python-version "$PYTHON_VERSION" --implementation cp \
        --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" --platform "manylinux2014_$arch" \
        "torch==$TORCH_VERSION" "${wanted[@]}" \
        || fail "pip download failed (above): check the host's pip configuration, or use WHEELHOUSE=0"
elif ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    say "$WHEELS holds wheels from an earlier run: the build installs from them (delete them to use the indexes)"
fi

# ---- 3. the image
say "building $IMAGE from docker/Dockerfile.cpu on $base"
build_started=$(date +%s)
docker build -f docker/Dockerfile.cpu -t "$IMAGE" \
    --build-arg "PYTHON_IMAGE=$base" --build-arg "TORCH_VERSION=$TORCH_VERSION" \
    --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" .
# the legacy builder keeps the install stage as an untagged image (about 1.6 GB): nothing uses it
docker image prune -f --filter "label=torchring.stage=install" >/dev/null
size=$(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}')
say "built $IMAGE ($size) in $(( $(date +%s) - build_started )) s; $(( $(date +%s) - started )) s in all"
