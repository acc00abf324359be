#!/usr/bin/env bash
# Builds a local stand-in for python:3.11-slim from Debian packages, for machines that reach Debian's
# package mirror but no image registry (air-gapped clusters, CI sandboxes):
#
#   sudo docker/make_base_image.sh [IMAGE]          # default IMAGE: torchring-base:bookworm
#
# debootstrap installs a minimal Debian bookworm (Python 3.11, venv, pip, CA certificates, the OpenSSH
# client and server that docker/Dockerfile.cpu needs) into a temporary directory, which is then imported
# as IMAGE. Like the slim Python images it has `python`, `python3`, `pip` and `pip3` on PATH (in
# /usr/local/bin) and pip may install into the system Python. Apt's package lists and archives,
# documentation and SSH host keys are left out. Needs root, debootstrap and a running Docker Engine.
# Settings: DEBIAN_SUITE (bookworm: its Python is 3.11, as in python:3.11-slim), DEBIAN_MIRROR.
set -euo pipefail

IMAGE=${1:-torchring-base:bookworm}
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,python3-venv,python3-pip,ca-certificates,openssh-client,openssh-server

fail() { echo "make_base_image: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "debootstrap needs root: run as root (or pull python:3.11-slim where a registry is reachable)"
command -v debootstrap >/dev/null || fail "debootstrap is not installed: apt-get install -y debootstrap"
docker info >/dev/null 2>&1 || fail "no Docker Engine answers (start dockerd, or check DOCKER_HOST)"

root=$(mktemp -d "${TMPDIR:-/var/tmp}/torchring-base.XXXXXX")
cleanup() {
    for mount in proc sys dev/pts dev; do umount "$root/$mount" 2>/dev/null || true; done
    rm -rf --one-file-system "$root" "$root.log"
}
trap cleanup EXIT

echo "make_base_image: installing Debian $SUITE with $PACKAGES from $MIRROR (a few minutes)"
started=$(date +%s)
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1; then
    tail -20 "$root.log" >&2
    fail "debootstrap failed (last lines above): check that $MIRROR is reachable, or set DEBIAN_MIRROR"
fi
rm -f "$root.log"

# The slim images' layout: python/pip on PATH in /usr/local/bin, and pip may install system-wide there.
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
ln -sf /usr/bin/python3 "$root/usr/local/bin/python3"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip"
ln -sf /usr/bin/pip3 "$root/usr/local/bin/pip3"
rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
# Apt works in derived images (where the mirror is reachable) from the same mirror.
echo "deb $MIRROR $SUITE main" >"$root/etc/apt/sources.list"
# Nothing machine-specific or cached in the image: host keys are made per image, apt state is fetched anew.
rm -f "$root"/etc/ssh/ssh_host_*
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log \
    "$root"/tmp/* "$root"/root/.cache
: >"$root/etc/machine-id"

tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    --message "torchring: Debian $SUITE with Python 3 from $MIRROR (docker/make_base_image.sh)" \
    - "$IMAGE" >/dev/null
echo "make_base_image: built $IMAGE in $(( $(date +%s) - started )) s," \
    "$(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}')"
