#!/usr/bin/env bash
# A real single-node Kubernetes v1.20.2 (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy; containerd 1.6 + runc + the CNI bridge, from Debian) for
# the end-to-end tests, after ../shared/REAL-NODE.md. Runs as root (re-executes itself with sudo).
#
#   scripts/kube-node.sh start DIR [IMAGE_TAR...]  bring the node up with its state in DIR,
#                                                 import each docker-archive IMAGE_TAR, wait
#                                                 for the node to be Ready, write DIR/env
#   scripts/kube-node.sh import DIR IMAGE_TAR...   import images into the running node
#   scripts/kube-node.sh stop DIR                 tear down what `start DIR` made
#   scripts/kube-node.sh test-image               build (once) localhost/kvserve-busybox:1.35,
#                                                 a 2 MB static busybox image; print its path
#
# DIR/env (KEY=value lines): KUBECONFIG (usable from the root network namespace), KUBE_API,
# NODE_NAME, NODE_IP, POD_CIDR, SERVICE_CIDR, NETNS, CONTAINERD_ADDRESS. There is no registry
# and no cluster DNS: pods use imported images with `imagePullPolicy: Never`, and ClusterIPs.
# Logs of every step and daemon are in DIR/logs; a failed step is named, with its log's tail.
#
# The node runs in its own network namespace with no default route: pod traffic cannot leave
# the machine. The root namespace reaches the node, the pods and the ClusterIPs through a veth
# pair. The node's processes share a private mount namespace where /var, /run and the global
# sysctls the kubelet would rewrite are shadowed by files under DIR, and its cgroups live under
# /kvserve-$NETNS, so nothing lands on the host; `stop` removes processes, cgroups, mounts,
# routes and the netns. Nodes with distinct names, addresses and CIDRs can run side by side.
#
# start is idempotent: on a DIR whose node is up it only imports the images; on a DIR with a
# broken or half-started node it stops what is left and starts afresh.
#
# Environment (defaults below): KVSERVE_NODE_HPA_SYNC and KVSERVE_NODE_HPA_DOWNSCALE (the
# controller-manager's --horizontal-pod-autoscaler-sync-period, default 15s, and
# -downscale-stabilization, default 5m0s); KVSERVE_NODE_{NAME,NETNS,VETH_HOST,VETH_NODE,HOST_IP,
# IP,POD_CIDR,POD_GATEWAY,SERVICE_CIDR,API_SERVICE_IP}; KVSERVE_K8S_CACHE (binaries, images).
#
# Measured on 2 busy cores with the binaries cached: start to node Ready 24-43 s (the pause
# image builds in 1 s, once); stop 7-15 s; the daemons' RSS with one pod is about 0.7 GB
# (kube-apiserver 314 MB). The first start builds the binaries (scripts/kube-control-plane.sh
# build, about 20 minutes on 2 cores). The apiserver serves the aggregation layer (front-proxy
# CA, requestheader flags, --enable-aggregator-routing) for extension APIs served from pods.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then exec sudo -E "$0" "$@"; fi

LOG_TAG=kube-node
LOG_FD=3
exec 3>&2
# shellcheck source=scripts/kube-common.sh
. "$(dirname "${BASH_SOURCE[0]}")/kube-common.sh"

PACKAGES=(containerd runc containernetworking-plugins iptables conntrack etcd-server openssl
    iproute2 curl gcc libc6-dev)
NODE_NAME="${KVSERVE_NODE_NAME:-realnode}"
NETNS="${KVSERVE_NODE_NETNS:-realnode}"
VETH_HOST="${KVSERVE_NODE_VETH_HOST:-rn-host}"
VETH_NODE="${KVSERVE_NODE_VETH_NODE:-rn-node}"
HOST_IP="${KVSERVE_NODE_HOST_IP:-172.31.255.1}"
NODE_IP="${KVSERVE_NODE_IP:-172.31.255.2}"
POD_CIDR="${KVSERVE_NODE_POD_CIDR:-10.244.0.0/24}"
POD_GATEWAY="${KVSERVE_NODE_POD_GATEWAY:-10.244.0.1}"
SERVICE_CIDR="${KVSERVE_NODE_SERVICE_CIDR:-10.96.0.0/16}"
API_SERVICE_IP="${KVSERVE_NODE_API_SERVICE_IP:-10.96.0.1}"
HPA_SYNC="${KVSERVE_NODE_HPA_SYNC:-15s}"
HPA_DOWNSCALE="${KVSERVE_NODE_HPA_DOWNSCALE:-5m0s}"
PAUSE_IMAGE="localhost/pause:3.4.1"
TEST_IMAGE="localhost/kvserve-busybox:1.35"
IMAGES="$CACHE/images"
CNI_BIN=/usr/lib/cni
# Global kernel sysctls the kubelet sets when they differ: shadowed with these values.
KUBELET_SYSCTLS=(vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1
    kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)
# Started in this order, stopped in the reverse one.
DAEMONS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

STEP=""
STEP_LOG=""
DIR=""
on_error() {
    local rc=$?
    log "FAILED at step '$STEP' (exit $rc)"
    if [ -n "$STEP_LOG" ] && [ -s "$STEP_LOG" ]; then
        log "first errors in $STEP_LOG:"
        grep -m 5 -E '^(Error|F[0-9]{4} |E[0-9]{4} )|level=(error|fatal)' "$STEP_LOG" >&3 || true
        log "last lines of $STEP_LOG:"
        tail -n 20 "$STEP_LOG" >&3
    fi
    log "scripts/kube-node.sh stop $DIR removes what was started"
    exit "$rc"
}
set -E
trap on_error ERR

run_step() {  # run_step NAME FUNCTION [ARG...]: FUNCTION's output goes to DIR/logs/NAME.log
    local name=$1 t0=$SECONDS
    shift
    STEP=$name
    STEP_LOG="$LOGS/$name.log"
    "$@" >>"$STEP_LOG" 2>&1
    log "$name: ok ($((SECONDS - t0)) s)"
}

set_dir() {  # the paths of a node whose state is in $1
    DIR=$1
    PKI="$DIR/pki"
    CONF="$DIR/conf"
    LOGS="$DIR/logs"
    PIDS="$DIR/pids"
    STATE="$DIR/state"
    NETNS_PATH="/run/netns/$NETNS"
    MNT_NS="/run/$NETNS-mnt"
    CGROUP_ROOT="/kvserve-$NETNS"  # the kubelet's cgroup root: kubepods lives under it
    SOCK="$STATE/containerd/containerd.sock"
}

SETTINGS=(NODE_NAME NETNS VETH_HOST VETH_NODE HOST_IP NODE_IP POD_CIDR POD_GATEWAY SERVICE_CIDR
    API_SERVICE_IP)

save_settings() {  # what stop needs even when it runs with other environment variables
    local v
    for v in "${SETTINGS[@]}"; do printf '%s=%q\n' "$v" "${!v}"; done >"$DIR/node.conf"
}

load_settings() {  # the settings the node in $DIR was started with
    # shellcheck source=/dev/null
    . "$DIR/node.conf"
    set_dir "$DIR"
}

# ---------------------------------------------------------------- helpers

in_node() { nsenter --net="$NETNS_PATH" --mount="$MNT_NS" "$@"; }

start_daemon() {  # start_daemon NAME COMMAND...: in the node namespaces, detached, PID in DIR/pids
    local name=$1
    shift
    STEP_LOG="$LOGS/$name.log"
    setsid nsenter --net="$NETNS_PATH" --mount="$MNT_NS" env TMPDIR="$STATE/tmp" "$@" \
        </dev/null >>"$STEP_LOG" 2>&1 3>&- &
    echo $! >"$PIDS/$name.pid"
}

alive() {  # alive NAME: its PID runs, in the node's mount namespace (not a reused PID)
    local pid
    [ -f "$PIDS/$1.pid" ] && pid=$(cat "$PIDS/$1.pid") && pid_alive "$pid" &&
        [ "$(stat -L -c %i "/proc/$pid/ns/mnt" 2>/dev/null)" = "$(stat -L -c %i "$MNT_NS")" ]
}

wait_daemon() {  # wait_daemon NAME SECONDS COMMAND...: until COMMAND succeeds; fails if NAME exits
    local name=$1 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        alive "$name" || { log "$name exited"; return 1; }
        [ $SECONDS -lt $deadline ] || { log "timed out waiting for $name"; return 1; }
        sleep 0.5
    done
}

kubectl_bin() {
    if [ -n "${KUBECTL:-}" ]; then echo "$KUBECTL"
    elif [ -x "$CACHE/tools/kubectl" ]; then echo "$CACHE/tools/kubectl"
    else command -v kubectl; fi
}

kube() { "$(kubectl_bin)" --kubeconfig "$DIR/host.kubeconfig" --request-timeout=20s "$@"; }

ctr_node() { ctr --address "$SOCK" -n k8s.io "$@"; }

api_ready() {
    curl -sf --max-time 5 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $(cut -d, -f1 "$PKI/tokens.csv")" \
        "https://$NODE_IP:6443/readyz"
}

# A docker-archive (what `docker save` writes) of one layer: what `ctr images import` loads.
wrap_image() {  # wrap_image LAYER_TAR TAG OUT_TAR CONFIG_JSON
    local layer=$1 tag=$2 out=$3 config=$4 work diff cfg
    work=$(mktemp -d)
    diff=$(sha256sum "$layer" | cut -d' ' -f1)
    mkdir "$work/$diff"
    cp "$layer" "$work/$diff/layer.tar"
    printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$config" "$diff" >"$work/config.json"
    cfg=$(sha256sum "$work/config.json" | cut -d' ' -f1)
    mv "$work/config.json" "$work/$cfg.json"
    printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
        "$cfg" "$tag" "$diff" >"$work/manifest.json"
    tar --numeric-owner --owner=0 --group=0 --mtime=@0 -C "$work" -cf "$out.tmp" \
        manifest.json "$cfg.json" "$diff"
    mv "$out.tmp" "$out"
    rm -rf "$work"
}

layer_of() {  # layer_of DIR OUT_TAR: a layer holding DIR's contents, owned by root
    tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$1" -cf "$2" .
}

# ---------------------------------------------------------------- steps of start

packages() { install_packages "${PACKAGES[@]}"; }

binaries() { "$KUBE_SCRIPTS/kube-control-plane.sh" build; }

pause_image() {  # the static pause from the Kubernetes source tree
    local out="$IMAGES/pause-3.4.1.tar" src="$CACHE/src/tree/build/pause/linux/pause.c" work
    [ -f "$out" ] && return 0
    [ -f "$src" ] || { echo "no $src: run scripts/kube-control-plane.sh build" >&2; return 1; }
    mkdir -p "$IMAGES"
    work=$(mktemp -d)
    mkdir "$work/root"
    gcc -Os -static -DVERSION=v3.4.1-local -o "$work/root/pause" "$src"
    strip "$work/root/pause"
    layer_of "$work/root" "$work/layer.tar"
    wrap_image "$work/layer.tar" "$PAUSE_IMAGE" "$out" '{"Entrypoint":["/pause"],"User":"65535:65535"}'
    rm -rf "$work"
}

test_image() {  # busybox (static) from Debian's package: a shell and an HTTP server in 2 MB
    local out="$IMAGES/kvserve-busybox-1.35.tar" work
    if [ ! -f "$out" ]; then
        mkdir -p "$IMAGES"
        work=$(mktemp -d)
        (cd "$work" && apt-get download -q busybox-static >/dev/null 2>&1)
        dpkg-deb -x "$work"/busybox-static_*.deb "$work/deb"
        mkdir -p "$work/root/bin" "$work/root/tmp"
        cp "$work/deb/bin/busybox" "$work/root/bin/busybox"
        ln -s busybox "$work/root/bin/sh"
        chmod 1777 "$work/root/tmp"
        layer_of "$work/root" "$work/layer.tar"
        wrap_image "$work/layer.tar" "$TEST_IMAGE" "$out" '{"Entrypoint":["/bin/busybox"],"Cmd":["sh"]}'
        rm -rf "$work"
    fi
    echo "$out"
}

record_run_netns() {  # `ip netns add` creates /run/netns and bind-mounts it on itself
    local existed=0 mounted=0
    [ ! -d /run/netns ] || existed=1
    ! mountpoint -q /run/netns || mounted=1
    printf 'RUN_NETNS_EXISTED=%s\nRUN_NETNS_MOUNTED=%s\n' "$existed" "$mounted" >"$DIR/host.conf"
}

network() {  # the node's netns, with no default route; the root netns routes to pods and ClusterIPs
    record_run_netns
    ip netns add "$NETNS"
    ip link add "$VETH_HOST" type veth peer name "$VETH_NODE" netns "$NETNS"
    ip addr add "$HOST_IP/30" dev "$VETH_HOST"
    ip link set "$VETH_HOST" up
    ip -n "$NETNS" addr add "$NODE_IP/30" dev "$VETH_NODE"
    ip -n "$NETNS" link set "$VETH_NODE" up
    ip -n "$NETNS" link set lo up
    # A route for the ClusterIPs so connections from the node itself reach kube-proxy's DNAT.
    ip -n "$NETNS" route add "$SERVICE_CIDR" dev "$VETH_NODE"
    nsenter --net="$NETNS_PATH" sysctl -qw net.ipv4.ip_forward=1  # this netns only
    ip route add "$POD_CIDR" via "$NODE_IP" dev "$VETH_HOST"
    ip route add "$SERVICE_CIDR" via "$NODE_IP" dev "$VETH_HOST"
}

mount_namespace() {  # private mounts: /var, /run and the kubelet's sysctls shadowed from DIR
    local kv key
    mkdir -p "$STATE"/{var/log,var/lib,var/tmp,var/cache,run,tmp,sysctl}
    ln -sfn /run "$STATE/var/run"
    ln -sfn /run/lock "$STATE/var/lock"
    touch "$MNT_NS"
    unshare --mount="$MNT_NS" --propagation private true
    for kv in "${KUBELET_SYSCTLS[@]}"; do
        key=${kv%=*}
        echo "${kv#*=}" >"$STATE/sysctl/${key//\//.}"
        nsenter --mount="$MNT_NS" sh -ec "mount --bind '$STATE/sysctl/${key//\//.}' /proc/sys/$key
            mount -o remount,bind,ro /proc/sys/$key"
    done
    nsenter --mount="$MNT_NS" mount --bind "$STATE/var" /var
    nsenter --mount="$MNT_NS" mount --bind "$STATE/run" /run
}

cgroups() {  # the node's own cgroup root in every hierarchy, so nodes never share pod cgroups
    local h
    for h in /sys/fs/cgroup/*/; do
        mountpoint -q "$h" || continue
        mkdir -p "$h${CGROUP_ROOT#/}"
        if [ -f "$h/cpuset.cpus" ]; then  # cgroup v1 cpuset: a child starts empty
            cat "$h/cpuset.cpus" >"$h${CGROUP_ROOT#/}/cpuset.cpus"
            cat "$h/cpuset.mems" >"$h${CGROUP_ROOT#/}/cpuset.mems"
        fi
    done
}

certificates() {
    local token
    token=$(openssl rand -hex 16)
    echo "$token,admin,admin,system:masters" >"$PKI/tokens.csv"
    new_ca ca kvserve-node-ca
    new_ca front-proxy-ca kvserve-front-proxy-ca
    new_cert apiserver ca "/CN=kube-apiserver" serverAuth \
        "IP:127.0.0.1,IP:$NODE_IP,IP:$API_SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
    new_cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
    new_cert front-proxy-client front-proxy-ca "/CN=front-proxy-client" clientAuth
    openssl genrsa -out "$PKI/sa.key" 2048
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
    kubeconfig "$DIR/admin.kubeconfig" 127.0.0.1 "$token"
    kubeconfig "$DIR/host.kubeconfig" "$NODE_IP" "$token"
    echo "nameserver 127.0.0.1" >"$CONF/resolv.conf"
}

new_ca() {  # new_ca NAME CN
    openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=$2" \
        -keyout "$PKI/$1.key" -out "$PKI/$1.crt"
}

new_cert() {  # new_cert NAME CA SUBJECT EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
    local name=$1 ca=$2
    openssl req -new -newkey rsa:2048 -nodes -subj "$3" -keyout "$PKI/$name.key" -out "$PKI/$name.csr"
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$4"
        [ -z "${5:-}" ] || echo "subjectAltName=$5"
    } >"$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
        -CAcreateserial -days 7 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt"
}

kubeconfig() {  # kubeconfig PATH SERVER_IP TOKEN
    cat >"$1" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: $NODE_NAME
  cluster: {server: "https://$2:6443", certificate-authority: "$PKI/ca.crt"}
users:
- name: admin
  user: {token: "$3"}
contexts:
- name: $NODE_NAME
  context: {cluster: $NODE_NAME, user: admin}
current-context: $NODE_NAME
KCFG
}

containerd_up() {
    mkdir -p "$STATE/containerd" "$STATE/cni/net.d" "$STATE/cni/ipam"
    cat >"$CONF/containerd.toml" <<TOML
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  netns_mounts_under_state_dir = true
  # runc cannot lower oom_score_adj here (no CAP_SYS_RESOURCE): cap it at containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$STATE/cni/net.d"
TOML
    cat >"$STATE/cni/net.d/10-bridge.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "$NODE_NAME", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
    start_daemon containerd containerd --config "$CONF/containerd.toml"
    wait_daemon containerd 30 ctr --address "$SOCK" version
}

import_images() {  # import_images TAR...
    local tar
    for tar in "$@"; do
        STEP_LOG="$LOGS/import.log"
        echo "importing $tar"
        ctr_node images import --snapshotter overlayfs "$tar"
    done
}

etcd_up() {
    start_daemon etcd etcd --data-dir "$STATE/etcd" --listen-client-urls http://127.0.0.1:2379 \
        --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
        --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster default=http://127.0.0.1:2380
    wait_daemon etcd 30 in_node curl -sf --max-time 2 http://127.0.0.1:2379/health
}

apiserver_up() {
    local aggregation
    mapfile -t aggregation < <(aggregation_flags "$PKI")
    start_daemon kube-apiserver "$BIN/kube-apiserver" --etcd-servers http://127.0.0.1:2379 \
        --bind-address 0.0.0.0 --advertise-address "$NODE_IP" --secure-port 6443 --insecure-port 0 \
        --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
        --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" \
        --authorization-mode Node,RBAC --service-cluster-ip-range "$SERVICE_CIDR" \
        --service-account-issuer https://kubernetes.default.svc \
        --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
        --api-audiences https://kubernetes.default.svc --cert-dir "$STATE/apiserver-certs" \
        --allow-privileged=true \
        --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types InternalIP \
        "${aggregation[@]}" \
        --enable-aggregator-routing=true
    wait_daemon kube-apiserver 90 api_ready
}

controller_manager_up() {
    start_daemon kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig "$DIR/admin.kubeconfig" --leader-elect=false --port 0 \
        --bind-address 127.0.0.1 --secure-port 0 \
        --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
        --use-service-account-credentials=false --controllers '*' \
        --flex-volume-plugin-dir "$STATE/volume-plugins" \
        --horizontal-pod-autoscaler-sync-period "$HPA_SYNC" \
        --horizontal-pod-autoscaler-downscale-stabilization "$HPA_DOWNSCALE"
    sleep 1
    alive kube-controller-manager
}

scheduler_up() {
    start_daemon kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$DIR/admin.kubeconfig" \
        --leader-elect=false --port 0 --bind-address 127.0.0.1 --secure-port 0
    sleep 1
    alive kube-scheduler
}

kubelet_up() {
    cat >"$CONF/kubelet-config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: "$PKI/ca.crt"}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: "$CGROUP_ROOT"
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
resolvConf: "$CONF/resolv.conf"
serializeImagePulls: false
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
    start_daemon kubelet "$BIN/kubelet" --config "$CONF/kubelet-config.yaml" \
        --kubeconfig "$DIR/admin.kubeconfig" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
        --root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki" \
        --volume-plugin-dir "$STATE/volume-plugins" \
        --container-runtime remote --container-runtime-endpoint "unix://$SOCK" \
        --pod-infra-container-image "$PAUSE_IMAGE"
    wait_daemon kubelet 60 in_node curl -sf --max-time 2 http://127.0.0.1:10248/healthz
}

proxy_up() {
    start_daemon kube-proxy "$BIN/kube-proxy" --kubeconfig "$DIR/admin.kubeconfig" \
        --hostname-override "$NODE_NAME" --bind-address "$NODE_IP" --proxy-mode iptables \
        --cluster-cidr "$POD_CIDR" --metrics-bind-address 127.0.0.1:10249 \
        --healthz-bind-address 127.0.0.1:10256 --conntrack-max-per-core 0 \
        --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0
    wait_daemon kube-proxy 60 in_node curl -sf --max-time 2 http://127.0.0.1:10256/healthz
}

node_ready() {  # the node is NotFound until the kubelet registers it
    STEP_LOG="$LOGS/kubelet.log"
    wait_daemon kubelet 60 kube get node "$NODE_NAME"
    kube wait --for=condition=Ready "node/$NODE_NAME" --timeout=120s
}

write_env() {
    cat >"$DIR/env" <<ENV
KUBECONFIG=$DIR/host.kubeconfig
KUBE_API=https://$NODE_IP:6443
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
POD_CIDR=$POD_CIDR
SERVICE_CIDR=$SERVICE_CIDR
NETNS=$NETNS
CONTAINERD_ADDRESS=$SOCK
ENV
}

running() {  # every daemon alive, the API ready and the node Ready
    local name
    [ -f "$DIR/node.conf" ] || return 1
    for name in "${DAEMONS[@]}"; do alive "$name" || return 1; done
    api_ready >/dev/null 2>&1 &&
        kube get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null |
        grep -qx True
}

start() {
    local dir=$1
    shift
    local images=() tar
    for tar in "$@"; do
        [ -f "$tar" ] || { log "no image archive $tar"; exit 1; }
        images+=("$(realpath "$tar")")
    done
    mkdir -p "$dir"
    set_dir "$(realpath "$dir")"
    case "$DIR/" in
    /var/* | /run/*) log "DIR must not be under /var or /run (the node shadows them)"; exit 2 ;;
    esac
    if [ -f "$DIR/node.conf" ]; then
        if (load_settings && running); then
            load_settings
            run_step import import_images "${images[@]}"
            write_env
            log "node $NODE_NAME already running; env in $DIR/env"
            return 0
        fi
        log "restarting the node in $DIR"
        (stop)
    fi
    [ ! -e "$NETNS_PATH" ] || { log "netns $NETNS exists: another node is running (stop it first)"; exit 1; }
    rm -rf "${DIR:?}"/{pki,conf,logs,pids,state,env,host.conf,admin.kubeconfig,host.kubeconfig}
    mkdir -p "$PKI" "$CONF" "$LOGS" "$PIDS" "$STATE"
    local t0=$SECONDS
    run_step packages packages
    run_step binaries binaries
    run_step pause-image pause_image
    save_settings
    run_step network network
    run_step mount-namespace mount_namespace
    run_step cgroups cgroups
    run_step certificates certificates
    run_step containerd containerd_up
    run_step import import_images "$IMAGES/pause-3.4.1.tar" "${images[@]}"
    run_step etcd etcd_up
    run_step kube-apiserver apiserver_up
    run_step kube-controller-manager controller_manager_up
    run_step kube-scheduler scheduler_up
    run_step kubelet kubelet_up
    run_step kube-proxy proxy_up
    run_step node-ready node_ready
    write_env
    log "node $NODE_NAME Ready in $((SECONDS - t0)) s; env in $DIR/env"
}

# ---------------------------------------------------------------- steps of stop

delete_workloads() {  # no controller left to recreate pods, then the pods, so CNI DEL runs
    api_ready >/dev/null 2>&1 || return 0
    # Stopping the controller-manager and the scheduler first also covers operators running
    # as pods: whatever they still create gets no pod.
    stop_pid kube-controller-manager "$PIDS/kube-controller-manager.pid"
    stop_pid kube-scheduler "$PIDS/kube-scheduler.pid"
    kube delete pods --all --all-namespaces --grace-period=2 --wait=false || true
    # The kubelet stops each sandbox (CNI DEL first) once its containers are gone; the API
    # objects linger a while longer, which teardown need not wait for.
    alive containerd && alive kubelet || return 0
    wait_for 60 "the kubelet to stop every pod" no_running_tasks || true
}

no_running_tasks() { ! ctr_node tasks ls 2>/dev/null | tail -n +2 | grep -vqw STOPPED; }

remove_containers() {  # whatever the kubelet left: kill and delete tasks and containers; shims exit
    alive containerd || return 0
    local id
    for id in $(ctr_node tasks ls -q 2>/dev/null || true); do
        ctr_node tasks delete --force "$id" || true
    done
    for id in $(ctr_node containers ls -q 2>/dev/null || true); do ctr_node containers delete "$id" || true; done
}

stop_daemons() {
    local i
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
        [ "${DAEMONS[i]}" = containerd ] && remove_containers
        echo "$(date +%T.%N) stopping ${DAEMONS[i]}"
        stop_pid "${DAEMONS[i]}" "$PIDS/${DAEMONS[i]}.pid"
    done
}

node_pids() {  # processes in the node's mount namespace or in its cgroups
    local ns pid
    if [ -e "$MNT_NS" ] && ns=$(stat -L -c %i "$MNT_NS" 2>/dev/null); then
        for pid in /proc/[0-9]*; do
            [ "$(stat -L -c %i "$pid/ns/mnt" 2>/dev/null)" = "$ns" ] && echo "${pid#/proc/}"
        done
    fi
    find /sys/fs/cgroup/*"$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null || true
}

kill_leftovers() {
    local pids
    pids=$(node_pids | sort -u | tr '\n' ' ')
    [ -n "${pids// /}" ] || return 0
    echo "killing leftover processes: $pids"
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    wait_for 10 "leftover processes to exit" bash -c "[ -z \"\$(ps -o pid= -p '${pids% }' 2>/dev/null)\" ]" || true
}

remove_cgroups() {  # the node's cgroup root, pod cgroups included, in every hierarchy
    wait_for 10 "the node's cgroups to empty" rmdir_cgroups
}

rmdir_cgroups() {
    local top
    for top in /sys/fs/cgroup/*"$CGROUP_ROOT"; do
        [ ! -d "$top" ] || find "$top" -depth -type d -exec rmdir {} + || return 1
    done
}

remove_namespaces() {
    if [ -e "$MNT_NS" ]; then
        ! mountpoint -q "$MNT_NS" || umount "$MNT_NS"
        rm -f "$MNT_NS"
    fi
    ! ip link show "$VETH_HOST" >/dev/null 2>&1 || ip link del "$VETH_HOST"
    [ ! -e "$NETNS_PATH" ] || ip netns del "$NETNS"
    # Undo what `ip netns add` did to /run/netns when this node did it and it is empty again.
    if [ -f "$DIR/host.conf" ]; then
        # shellcheck source=/dev/null
        . "$DIR/host.conf"
        if [ "$RUN_NETNS_MOUNTED" = 0 ] && [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
            ! mountpoint -q /run/netns || umount /run/netns
            [ "$RUN_NETNS_EXISTED" = 1 ] || rmdir /run/netns
        fi
    fi
}

stop() {
    [ -f "$DIR/node.conf" ] || { log "no node in $DIR"; return 0; }
    load_settings
    mkdir -p "$LOGS" "$PIDS"
    local t0=$SECONDS
    run_step delete-workloads delete_workloads
    run_step stop-daemons stop_daemons
    run_step kill-leftovers kill_leftovers
    run_step remove-namespaces remove_namespaces
    run_step remove-cgroups remove_cgroups
    rm -f "$DIR/env" "$DIR/node.conf" "$DIR/host.conf"
    log "node $NODE_NAME stopped in $((SECONDS - t0)) s"
}

case "${1:-}" in
start) [ $# -ge 2 ] || { echo "usage: $0 start DIR [IMAGE_TAR...]" >&2; exit 2; }; start "${@:2}" ;;
import)
    [ $# -ge 3 ] || { echo "usage: $0 import DIR IMAGE_TAR..." >&2; exit 2; }
    set_dir "$(realpath "$2")"
    [ -f "$DIR/node.conf" ] || { log "no node in $DIR"; exit 1; }
    load_settings
    images=()
    for tar in "${@:3}"; do images+=("$(realpath "$tar")"); done
    run_step import import_images "${images[@]}"
    ;;
stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; set_dir "$(realpath "$2")"; stop ;;
test-image) test_image ;;
*) echo "usage: $0 {start DIR [IMAGE_TAR...]|import DIR IMAGE_TAR...|stop DIR|test-image}" >&2; exit 2 ;;
esac
