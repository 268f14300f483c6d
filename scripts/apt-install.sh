#!/usr/bin/env bash
# apt-install.sh PACKAGE...: install the Debian packages not installed yet.
# Another apt or dpkg (an unattended upgrade, a second `make test`) may hold the package
# locks; apt-get then fails at once with "Could not get lock". Wait for them, up to
# KVSERVE_APT_LOCK_WAIT seconds (default 600), instead of failing.
set -euo pipefail

log() { echo "[apt-install] $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

deadline=$((SECONDS + ${KVSERVE_APT_LOCK_WAIT:-600}))
apt_get() {  # apt_get ARGS...: apt-get, retried while another process holds apt's locks
    local out
    while true; do
        if out=$(as_root env DEBIAN_FRONTEND=noninteractive apt-get "$@" 2>&1); then
            return 0
        fi
        if ! grep -q "Could not get lock" <<<"$out" || [ $SECONDS -ge $deadline ]; then
            echo "$out" >&2
            log "apt-get $1 failed"
            return 1
        fi
        log "another process holds apt's lock; waiting"
        sleep "${KVSERVE_APT_LOCK_POLL:-5}"
    done
}

log "installing ${missing[*]}"
apt_get update -qq
apt_get install -y -qq "${missing[@]}" >/dev/null
