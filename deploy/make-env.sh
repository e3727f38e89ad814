#!/usr/bin/env bash
# Makes .env, which docker compose reads beside docker-compose.yml and git ignores: a copy of
# .env.example with a new TRITON_ADMIN_KEY and GRAFANA_ADMIN_PASSWORD appended, readable by
# its owner only. Run it again at any time: a .env already there is kept as it is, and only a
# secret it lacks is added, so the key and the password stay the same across shells and
# restarts. To make a new key: delete its line from .env, run this, `docker compose up -d`.
#
#   bash deploy/make-env.sh
set -euo pipefail
umask 077

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
env_file="$root/.env"

if [ ! -e "$env_file" ]; then
    cp "$root/.env.example" "$env_file"
    echo "make-env: wrote $env_file from .env.example"
fi
chmod 600 "$env_file"

# 32 random bytes as 64 hex digits (what `openssl rand -hex 32` prints), from the kernel.
secret() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }

for name in TRITON_ADMIN_KEY GRAFANA_ADMIN_PASSWORD; do
    if grep -Eq "^${name}=.+" "$env_file"; then
        echo "make-env: $name is set in $env_file; kept"
    else
        sed -i "/^${name}=[[:space:]]*\$/d" "$env_file"
        # A last line without its newline would swallow the one appended.
        [ -z "$(tail -c1 "$env_file")" ] || echo >>"$env_file"
        echo "${name}=$(secret)" >>"$env_file"
        echo "make-env: $name added to $env_file"
    fi
    if [ -n "${!name:-}" ]; then
        echo "make-env: note: $name is also set in this shell, and compose takes the shell's value" \
            "over .env's: unset it (unset $name)"
    fi
done
