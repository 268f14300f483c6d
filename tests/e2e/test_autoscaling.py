"""The real HPA scales an LLMDeployment on queue depth through kvserve's own custom metrics API.

A node of its own (scripts/kube-node.sh, names and networks apart from the other e2e and node
tests, a 5 s HPA sync), the serving image imported, the operator chart installed with its
defaults (the metrics API on) but for the image, its pull policy and a short resync; then
e2e/autoscale.py's scenario: load up to 2+ Ready pods, load off back to 1, no stream cut. The
node is stopped at the end, whatever happened. Root only; KVSERVE_SKIP_E2E=1 skips it.
"""

import sys
from collections.abc import Iterator

import pytest
from k8s.support import BUILD_TIMEOUT, ROOT, KubeTools
from real_node import NODE_TIMEOUT, real_node, skip_reason

sys.path.insert(0, str(ROOT / "e2e"))
from autoscale import run_autoscaling
from failure_reports import report_failure
from scenarios import SCENARIOS, Context, check_operator_log, run_scenario

NODE_SETTINGS = {
    "KVSERVE_NODE_NAME": "kvnode-hpa",
    "KVSERVE_NODE_NETNS": "kvnode-hpa",
    "KVSERVE_NODE_VETH_HOST": "kh-host",
    "KVSERVE_NODE_VETH_NODE": "kh-node",
    "KVSERVE_NODE_HOST_IP": "172.31.252.1",
    "KVSERVE_NODE_IP": "172.31.252.2",
    "KVSERVE_NODE_POD_CIDR": "10.247.0.0/24",
    "KVSERVE_NODE_POD_GATEWAY": "10.247.0.1",
    "KVSERVE_NODE_SERVICE_CIDR": "10.99.0.0/16",
    "KVSERVE_NODE_API_SERVICE_IP": "10.99.0.1",
    "KVSERVE_NODE_HPA_SYNC": "5s",
    "KVSERVE_NODE_HPA_DOWNSCALE": "15s",
}
"""Apart from tests/e2e/test_real_cluster.py's and tests/node's nodes, so all can run at once."""
SCALE_UP_BOUND = 120.0
SCALE_DOWN_BOUND = 150.0

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


@pytest.fixture(scope="module")
def context(kube_tools: KubeTools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Context]:
    with real_node(kube_tools, tmp_path_factory.mktemp("hpa-node"), NODE_SETTINGS) as cluster:
        yield Context(cluster, namespace="kvserve-hpa", image="localhost/kvserve:dev",
                      pull_policy="Never", chart_values=())  # fmt: skip


@pytest.mark.timeout(BUILD_TIMEOUT + NODE_TIMEOUT + 900)
def test_hpa_scales_on_queue_depth(context: Context) -> None:
    (install,) = [s for s in SCENARIOS if s.name == "operator-installed"]
    try:
        run_scenario(context, install)
        result = run_autoscaling(
            context, scale_up_timeout=SCALE_UP_BOUND, scale_down_timeout=SCALE_DOWN_BOUND
        )
        check_operator_log(context)
    except BaseException:
        report_failure("autoscaling", context)
        raise
    print(f"ok  autoscaling  {result.summary()}", flush=True)
    assert result.second_ready - result.load_started <= SCALE_UP_BOUND
    assert result.max_replicas_seen >= 2
    assert len(result.removed) >= 1
