"""The end-to-end scenarios (e2e/scenarios.py) on a real single-node cluster, with real pods.

The module fixture builds the serving image (scripts/build-image.sh, cached), starts a node
(scripts/kube-node.sh: control plane, containerd, kubelet and kube-proxy in their own network
namespace) with that image imported, and stops the node at the end, whatever happened. Each
scenario is one test, in the order of ``SCENARIOS``: each builds on what the previous one left,
so after a failure the rest are skipped. Traffic goes to the Services' ClusterIPs and the pod
IPs, which the node routes from the root network namespace.

Root only. KVSERVE_SKIP_E2E=1 skips them explicitly, and so does KVSERVE_SKIP_K8S=1 (no
Kubernetes binaries are built then).
"""

import sys
from collections.abc import Iterator

import pytest
from k8s.support import BUILD_TIMEOUT, ROOT, KubeTools, inference_pool_crd

sys.path.insert(0, str(ROOT / "e2e"))
from failure_reports import report_failure
from leader_worker_group import leader_worker_group_serves_as_one_model
from real_node import NODE_TIMEOUT, real_node, skip_reason
from scenarios import SCENARIOS, Context, Scenario, run_scenario

ALL = [*SCENARIOS, Scenario("leader-worker-group", leader_worker_group_serves_as_one_model)]
"""``SCENARIOS``, then the multi-node one (e2e/leader_worker_group.py), which imports them."""

NODE_SETTINGS = {
    "KVSERVE_NODE_NAME": "kvserve-e2e",
    "KVSERVE_NODE_NETNS": "kvse2e",
    "KVSERVE_NODE_VETH_HOST": "kvse2e-host",
    "KVSERVE_NODE_VETH_NODE": "kvse2e-node",
    "KVSERVE_NODE_HOST_IP": "172.31.253.1",
    "KVSERVE_NODE_IP": "172.31.253.2",
    "KVSERVE_NODE_POD_CIDR": "10.246.0.0/24",
    "KVSERVE_NODE_POD_GATEWAY": "10.246.0.1",
    "KVSERVE_NODE_SERVICE_CIDR": "10.98.0.0/16",
    "KVSERVE_NODE_API_SERVICE_IP": "10.98.0.1",
}
"""A node of its own (namespace, addresses, cgroup root), apart from the node tests' one."""
NO_DNS = "[Errno -3] Temporary failure in name resolution"
"""The node has no cluster DNS: a pod's resolv.conf names 127.0.0.1, where nothing answers."""


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.fixture(scope="module")
def context(kube_tools: KubeTools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Context]:
    with real_node(kube_tools, tmp_path_factory.mktemp("node"), NODE_SETTINGS) as cluster:
        yield Context(cluster, image="localhost/kvserve:dev", pull_policy="Never",
                      inference_pool_crd=inference_pool_crd(for_1_20=True),
                      name_resolution_error=NO_DNS)  # fmt: skip


@pytest.fixture(scope="module")
def failed() -> list[str]:
    """Names of the scenarios that failed so far."""
    return []


@pytest.mark.timeout(BUILD_TIMEOUT + NODE_TIMEOUT + 900)
@pytest.mark.parametrize("scenario", ALL, ids=[s.name for s in ALL])
def test_scenario(context: Context, scenario: Scenario, failed: list[str]) -> None:
    if failed:
        pytest.skip(f"{failed[0]} failed; the scenarios after it build on its state")
    try:
        run_scenario(context, scenario)
    except BaseException:
        failed.append(scenario.name)
        report_failure(scenario.name, context)
        raise
