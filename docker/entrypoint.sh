#!/bin/sh
# Entrypoint of torchring's images (docker/Dockerfile, docker/Dockerfile.cpu).
#
# 1. SSH keys. Public keys from any of these are added to ~/.ssh/authorized_keys (mode 600):
#      $TORCHRING_SSH_AUTHORIZED_KEY                   one or more public keys, one a line
#      $TORCHRING_SSH_KEY_DIR/id_ed25519.pub           default dir /run/torchring-ssh (compose.yaml's
#                                                      `ssh-keys` volume, filled by its keygen service)
#      $TORCHRING_SSH_SECRETS_DIR/torchring_ssh_key.pub default dir /run/secrets (a secret or bind mount)
#    The first private key found ($TORCHRING_SSH_KEY_DIR/id_ed25519, then
#    $TORCHRING_SSH_SECRETS_DIR/torchring_ssh_key) is copied to ~/.ssh/torchring_id (mode 600, owned by
#    this user whatever the mount's owner and modes) and its public half is authorized too: every
#    container that holds the shared key accepts logins from the others.
# 2. ~/.ssh/config (unless one not written here exists): every host on port $TORCHRING_SSH_PORT (2222),
#    new host keys accepted on first use, the key above. ~/.ssh/environment: PATH and LD_LIBRARY_PATH
#    for SSH sessions, which do not inherit the container's environment.
# 3. TORCHRING_START_SSHD=1: check sshd's configuration, then start sshd as this (non-root) user on
#    port $TORCHRING_SSH_PORT in the background, logging to the container's stderr.
# 4. exec the command; with none, `sleep infinity` (a worker that only serves SSH).
set -eu

SSH_PORT=${TORCHRING_SSH_PORT:-2222}
KEY_DIR=${TORCHRING_SSH_KEY_DIR:-/run/torchring-ssh}
SECRETS_DIR=${TORCHRING_SSH_SECRETS_DIR:-/run/secrets}
SSHD_CONFIG=${TORCHRING_SSHD_CONFIG:-/etc/torchring/sshd/sshd_config}
SSH_HOME=$HOME/.ssh
AUTHORIZED=$SSH_HOME/authorized_keys
IDENTITY=$SSH_HOME/torchring_id
MARKER="# Written by torchring's container entrypoint; delete this line to keep your own changes."

log() {
    printf 'torchring-entrypoint: %s\n' "$*" >&2
}

# Append each non-empty, non-comment line of $1 to authorized_keys unless it is already there.
authorize() {
    printf '%s\n' "$1" | while IFS= read -r key; do
        case $key in
            '' | '#'*) continue ;;
        esac
        if ! grep -qxF -- "$key" "$AUTHORIZED"; then
            printf '%s\n' "$key" >>"$AUTHORIZED"
        fi
    done
}

saved_umask=$(umask)
umask 077
mkdir -p "$SSH_HOME"
chmod 700 "$SSH_HOME"
touch "$AUTHORIZED"
chmod 600 "$AUTHORIZED"

if [ -n "${TORCHRING_SSH_AUTHORIZED_KEY:-}" ]; then
    authorize "$TORCHRING_SSH_AUTHORIZED_KEY"
fi
for public_key in "$KEY_DIR/id_ed25519.pub" "$SECRETS_DIR/torchring_ssh_key.pub"; do
    if [ -r "$public_key" ]; then
        authorize "$(cat "$public_key")"
    fi
done

for private_key in "$KEY_DIR/id_ed25519" "$SECRETS_DIR/torchring_ssh_key"; do
    if [ -r "$private_key" ]; then
        cp "$private_key" "$IDENTITY"
        chmod 600 "$IDENTITY"
        if public_half=$(ssh-keygen -y -P '' -f "$IDENTITY" 2>/dev/null); then
            authorize "$public_half"
        else
            log "cannot read the public half of $private_key (a passphrase?); authorize it another way"
        fi
        break
    fi
done

if [ ! -e "$SSH_HOME/config" ] || [ "$(head -n 1 "$SSH_HOME/config")" = "$MARKER" ]; then
    {
        printf '%s\n' "$MARKER"
        printf 'Host *\n'
        printf '    Port %s\n' "$SSH_PORT"
        printf '    StrictHostKeyChecking accept-new\n'
        printf '    ServerAliveInterval 15\n'
        printf '    ServerAliveCountMax 4\n'
        if [ -f "$IDENTITY" ]; then
            printf '    IdentityFile %s\n' "$IDENTITY"
        fi
    } >"$SSH_HOME/config"
    chmod 600 "$SSH_HOME/config"
fi

{
    printf 'PATH=%s\n' "$PATH"
    if [ -n "${LD_LIBRARY_PATH:-}" ]; then
        printf 'LD_LIBRARY_PATH=%s\n' "$LD_LIBRARY_PATH"
    fi
} >"$SSH_HOME/environment"
umask "$saved_umask"

if [ "${TORCHRING_START_SSHD:-0}" = 1 ]; then
    if [ ! -s "$AUTHORIZED" ]; then
        log "starting sshd, but no public key was given: nobody can log in (see docker/README.md)"
    fi
    /usr/sbin/sshd -t -f "$SSHD_CONFIG" -p "$SSH_PORT"
    /usr/sbin/sshd -D -e -f "$SSHD_CONFIG" -p "$SSH_PORT" &
    log "sshd started on port $SSH_PORT (pid $!)"
fi

if [ "$#" -eq 0 ]; then
    set -- sleep infinity
fi
exec "$@"
