"""scripts/kube-node.sh on this machine: a Ready node, a pod served through its ClusterIP from
the root network namespace, the apiserver's aggregation layer and HPA settings, and a host left
exactly as it was after ``stop`` (processes, mounts, routes, netns, sysctls, cgroups, paths).

The tests run in file order: the last one stops the node and compares the host with the
snapshot taken before ``start``.
"""

import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]
NODE_SCRIPT = ROOT / "scripts" / "kube-node.sh"
HPA_SYNC = "5s"
HPA_DOWNSCALE = "30s"
SYSCTLS = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
)
# Names of its own, so that this node and the e2e tests' node (the defaults) can run side by side.
NETWORK = {
    "KVSERVE_NODE_NETNS": "kvnode-test",
    "KVSERVE_NODE_VETH_HOST": "kt-host",
    "KVSERVE_NODE_VETH_NODE": "kt-node",
    "KVSERVE_NODE_HOST_IP": "172.31.254.1",
    "KVSERVE_NODE_IP": "172.31.254.2",
    "KVSERVE_NODE_POD_CIDR": "10.245.0.0/24",
    "KVSERVE_NODE_POD_GATEWAY": "10.245.0.1",
    "KVSERVE_NODE_SERVICE_CIDR": "10.97.0.0/16",
    "KVSERVE_NODE_API_SERVICE_IP": "10.97.0.1",
}
CGROUP_ROOT = "kvserve-kvnode-test"
# Paths the node's components write to by default: the private /var and /run keep them off the host.
HOST_PATHS = (
    "/run/containerd",
    "/var/lib/containerd",
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/opt/containerd",
    "/etc/cni",
)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a real node needs root (netns, mounts)"),
    pytest.mark.skipif(
        os.environ.get("KVSERVE_SKIP_E2E") == "1", reason="KVSERVE_SKIP_E2E=1 skips the real node"
    ),
    pytest.mark.skipif(
        os.environ.get("KVSERVE_SKIP_K8S") == "1",
        reason="KVSERVE_SKIP_K8S=1 skips building the Kubernetes binaries the node runs",
    ),
    # The first start builds the five binaries when they are not cached yet (~20 min, once).
    pytest.mark.timeout(2400),
]


def host_state(state: Path) -> dict[str, object]:
    """What the node in ``state`` may change on the host, and ``stop`` must restore. Limited to
    this node's names and paths: another node (the e2e tests') may start or stop meanwhile.
    """

    def run(*cmd: str) -> list[str]:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()

    def ours(lines: list[str]) -> list[str]:
        names = [NETWORK[k] for k in ("KVSERVE_NODE_NETNS", "KVSERVE_NODE_VETH_HOST")]
        names += [NETWORK[k] for k in ("KVSERVE_NODE_POD_CIDR", "KVSERVE_NODE_SERVICE_CIDR")]
        return [line for line in lines if any(name in line for name in [*names, str(state)])]

    def cmdlines() -> list[str]:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if str(state).encode() in cmdline.read_bytes():
                    found.append(cmdline.parent.name)
            except (FileNotFoundError, ProcessLookupError):
                pass
        return found

    return {
        "routes": ours(run("ip", "route")),
        "netns": ours(run("ip", "netns", "list")),
        "links": ours(run("ip", "-o", "link")),
        "mounts": ours(Path("/proc/mounts").read_text().splitlines()),
        "sysctls": {key: Path("/proc/sys", key).read_text() for key in SYSCTLS},
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/" + CGROUP_ROOT)),
        "paths": {path: os.path.lexists(path) for path in HOST_PATHS},
        "processes": cmdlines(),
    }


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/PID/stat), None once it is gone (a zombie
    that init has not reaped yet is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else fields[19]


def node_processes(mount_ns: Path) -> dict[int, str]:
    """PID → start time of every process in the node's mount namespace or a pod's cgroup."""
    ns = os.stat(mount_ns).st_ino
    pids = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.stat(proc / "ns" / "mnt").st_ino == ns:
                    pids.add(int(proc.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    for procs in Path("/sys/fs/cgroup/pids", CGROUP_ROOT).rglob("cgroup.procs"):
        pids.update(int(p) for p in procs.read_text().split())
    return {pid: start for pid in pids if (start := process_start(pid)) is not None}


@dataclass
class Node:
    dir: Path
    env: dict[str, str]
    before: dict[str, object]

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(self.env["KUBECONFIG"])

    def in_netns(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        netns = f"--net=/run/netns/{self.env['NETNS']}"
        return subprocess.run(["nsenter", netns, *cmd], capture_output=True, text=True)

    def stop(self) -> None:
        subprocess.run([str(NODE_SCRIPT), "stop", str(self.dir)], check=True, timeout=300)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    image = subprocess.run(
        [str(NODE_SCRIPT), "test-image"], capture_output=True, text=True, check=True, timeout=300
    ).stdout.strip()
    state = tmp_path_factory.mktemp("node")
    before = host_state(state)
    env = {
        **os.environ,
        **NETWORK,
        "KVSERVE_NODE_HPA_SYNC": HPA_SYNC,
        "KVSERVE_NODE_HPA_DOWNSCALE": HPA_DOWNSCALE,
    }
    started = time.monotonic()
    subprocess.run(
        [str(NODE_SCRIPT), "start", str(state), image], env=env, check=True, timeout=2300
    )
    print(f"node Ready {time.monotonic() - started:.1f} s after start")
    values = dict(line.split("=", 1) for line in (state / "env").read_text().splitlines())
    node = Node(state, values, before)
    yield node
    node.stop()  # a no-op once test_stop_leaves_the_host_as_it_was has stopped it


def test_node_is_ready_with_no_route_out(node: Node) -> None:
    core = client.CoreV1Api(node.api())
    (found,) = core.list_node().items
    assert found.metadata.name == node.env["NODE_NAME"]
    ready = {c.type: c.status for c in found.status.conditions}["Ready"]
    assert ready == "True"
    assert found.status.node_info.kubelet_version == "v1.20.2"
    assert found.status.node_info.container_runtime_version.startswith("containerd://")
    internal = [a.address for a in found.status.addresses if a.type == "InternalIP"]
    assert internal == [node.env["NODE_IP"]]
    # The kubelet found the global sysctls it wants already set (shadowed in its mount
    # namespace) and wrote none of them on the host.
    assert host_state(node.dir)["sysctls"] == node.before["sysctls"]
    # No default route in the node's netns: any address outside the machine is unreachable.
    outside = node.in_netns("ip", "route", "get", "192.0.2.1")
    assert outside.returncode != 0
    assert "Network is unreachable" in outside.stderr


def test_pod_is_ready_and_answers_through_its_cluster_ip(node: Node) -> None:
    api = node.api()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    token = uuid.uuid4().hex
    labels = {"app": "web"}
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "web"}, "data": {"index.html": token}}
    )
    container = {
        "name": "web",
        "image": "localhost/kvserve-busybox:1.35",
        "imagePullPolicy": "Never",
        "command": ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
        "securityContext": {
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "www", "mountPath": "/www"}],
    }
    apps.create_namespaced_deployment(
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534},
                        "containers": [container],
                        "volumes": [{"name": "www", "configMap": {"name": "web"}}],
                    },
                },
            },
        },
    )
    service = core.create_namespaced_service(
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    deadline = time.monotonic() + 120
    while True:
        pods = core.list_namespaced_pod("default", label_selector="app=web").items
        ready = [
            p
            for p in pods
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]
        if ready:
            break
        assert time.monotonic() < deadline, f"pod not Ready: {[p.status for p in pods]}"
        time.sleep(0.5)
    (pod,) = ready
    assert ip_address(pod.status.pod_ip) in ip_network(node.env["POD_CIDR"])
    cluster_ip = service.spec.cluster_ip
    assert ip_address(cluster_ip) in ip_network(node.env["SERVICE_CIDR"])
    # From this (the root) network namespace, through kube-proxy's rules in the node's.
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://{cluster_ip}/", timeout=5) as answer:
                assert answer.status == 200
                assert answer.read().decode() == token
                break
        except OSError:
            assert time.monotonic() < deadline, "the ClusterIP never answered"
            time.sleep(0.5)


def test_apiserver_serves_the_aggregation_layer_and_hpa_settings_apply(node: Node) -> None:
    core = client.CoreV1Api(node.api())
    auth = core.read_namespaced_config_map("extension-apiserver-authentication", "kube-system").data
    assert auth["requestheader-allowed-names"] == '["front-proxy-client"]'
    assert auth["requestheader-username-headers"] == '["X-Remote-User"]'
    assert auth["requestheader-group-headers"] == '["X-Remote-Group"]'
    assert auth["requestheader-extra-headers-prefix"] == '["X-Remote-Extra-"]'
    front_proxy_ca = (node.dir / "pki" / "front-proxy-ca.crt").read_text()
    assert auth["requestheader-client-ca-file"].strip() == front_proxy_ca.strip()
    pid = (node.dir / "pids" / "kube-controller-manager.pid").read_text().strip()
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert args[args.index("--horizontal-pod-autoscaler-sync-period") + 1] == HPA_SYNC
    assert (
        args[args.index("--horizontal-pod-autoscaler-downscale-stabilization") + 1] == HPA_DOWNSCALE
    )


def test_stop_leaves_the_host_as_it_was(node: Node) -> None:
    mount_ns = Path(f"/run/{node.env['NETNS']}-mnt")
    running = node_processes(mount_ns)
    assert len(running) >= 10  # 7 daemons, a shim, pause, busybox
    assert host_state(node.dir) != node.before  # the snapshot does see a running node
    started = time.monotonic()
    node.stop()
    print(f"node stopped in {time.monotonic() - started:.1f} s")
    left = {pid for pid, start in running.items() if process_start(pid) == start}
    assert left == set()
    after = host_state(node.dir)
    for key, value in node.before.items():
        assert after[key] == value, key
    assert not (node.dir / "env").exists()
