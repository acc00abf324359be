#!/bin/sh
# The part of torchring's images that does not depend on how torch gets in: run as root by both
# docker/Dockerfile (CUDA) and docker/Dockerfile.cpu, from the directory holding this script,
# docker/sshd_config and docker/entrypoint.sh (COPY'd there by the Dockerfile, deleted afterwards).
#
# * the OpenSSH client and server, when the base image lacks them (apt; the local Debian base of
#   docker/make_base_image.sh already has them, so a build there needs no network), without the
#   base's host keys and without apt's package lists;
# * the non-root user torchring, uid 1000 (a base image's own uid-1000 user is replaced), its ~/.ssh,
#   /workspace, and the directory that compose.yaml's ssh-keys volume mounts over;
# * sshd's own directory /etc/torchring/sshd with its config and one host key made here, at build time:
#   every container of one image has the same host key (containers of one cluster accept each other);
# * the entrypoint, /usr/local/bin/torchring-entrypoint.
set -eu
here=$(cd "$(dirname "$0")" && pwd)

if ! command -v ssh >/dev/null 2>&1 || ! command -v sshd >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openssh-client openssh-server
fi
rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

if id 1000 >/dev/null 2>&1; then userdel --remove "$(id -un 1000)"; fi
useradd --create-home --uid 1000 --user-group --shell /bin/bash --password '*' torchring
mkdir -p /etc/torchring
install -d -m 700 -o torchring -g torchring /home/torchring/.ssh /etc/torchring/sshd /run/torchring-ssh
install -d -m 755 -o torchring -g torchring /workspace
ssh-keygen -q -t ed25519 -N '' -C torchring-host -f /etc/torchring/sshd/ssh_host_ed25519_key
chown torchring:torchring /etc/torchring/sshd/ssh_host_ed25519_key /etc/torchring/sshd/ssh_host_ed25519_key.pub
install -m 644 "$here/sshd_config" /etc/torchring/sshd/sshd_config
install -m 755 "$here/entrypoint.sh" /usr/local/bin/torchring-entrypoint
