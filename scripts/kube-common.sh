# What scripts/kube-control-plane.sh and scripts/kube-node.sh share; sourced, never run.
# The sourcing script sets LOG_TAG (and may set LOG_FD, the fd log() writes to; default 2).

KUBE_SCRIPTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KVSERVE_K8S_CACHE:-$HOME/.cache/kvserve-k8s}"
BIN="$CACHE/bin"

log() { echo "[${LOG_TAG:-kube}] $*" >&"${LOG_FD:-2}"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

install_packages() {  # install_packages PACKAGE...: those not installed yet, waiting up to
    # 5 minutes while another apt or dpkg holds the lock
    KVSERVE_APT_LOCK_WAIT="${KVSERVE_APT_LOCK_WAIT:-300}" "$KUBE_SCRIPTS/apt-install.sh" "$@"
}

# The Debian mirror the machine's own apt sources use.
debian_uri() {
    local uri
    uri=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
        2>/dev/null | grep -v security | head -n1 |
        sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' |
        awk '{print $1}')
    [ -n "$uri" ] || { log "no Debian mirror found in /etc/apt"; return 1; }
    echo "$uri"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || { log "timed out waiting for $what"; return 1; }
        sleep 0.5
    done
}

pid_alive() {  # pid_alive PID: running (a zombie that init has not reaped yet is not)
    [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

pid_gone() { ! pid_alive "$1"; }

stop_pid() {  # stop_pid NAME PIDFILE: SIGTERM, SIGKILL after 20 s; removes PIDFILE
    local name=$1 pidfile=$2 pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if kill "$pid" 2>/dev/null; then
        wait_for 20 "$name to stop" pid_gone "$pid" || {
            kill -9 "$pid" 2>/dev/null || true
            wait_for 5 "$name to die" pid_gone "$pid" || true
        }
    fi
    rm -f "$pidfile"
}

# aggregation_flags PKI: the kube-apiserver flags of the aggregation layer (front-proxy CA and
# client certificate in PKI), one per line: read them with mapfile.
aggregation_flags() {
    printf '%s\n' \
        --requestheader-client-ca-file "$1/front-proxy-ca.crt" \
        --requestheader-allowed-names front-proxy-client \
        --requestheader-username-headers X-Remote-User \
        --requestheader-group-headers X-Remote-Group \
        --requestheader-extra-headers-prefix X-Remote-Extra- \
        --proxy-client-cert-file "$1/front-proxy-client.crt" \
        --proxy-client-key-file "$1/front-proxy-client.key"
}
