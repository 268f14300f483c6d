"""kvserve's metrics API behind a real kube-apiserver, read by the real HPA controller (v1.20).

The chart is installed as it ships (metrics API on); its server runs on the host as the chart's
ServiceAccount with the chart's certificate, reached through an ExternalName Service
(``localhost``) since the control plane has no kube-proxy. There is no kubelet: the tests play
the node, marking pods Ready at 127.0.0.1 with a port where a thread serves the real
``ServerMetrics`` exposition. Set KVSERVE_SKIP_K8S=1 to skip these tests explicitly.
"""

import base64
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from k8s.cluster_objects import apply_yaml, llmd, namespace
from k8s.kube_cluster import ControlPlane, wait_for
from k8s.support import NEEDS_CLUSTER, ROOT, load_sample
from kvserve.engine.core.scheduler import SchedulerStats
from kvserve.operator.autoscaler import KV_USAGE_METRIC, WAITING_METRIC, render_hpa
from kvserve.operator.kube import Kube
from kvserve.operator.metrics_source import MetricsSource
from kvserve.operator.reconciler import Reconciler
from kvserve.operator.resource import labels, selector_labels, selector_string
from kvserve.operator.spec import AutoscalingSpec
from kvserve.server.metrics import ServerMetrics

pytestmark = NEEDS_CLUSTER

RELEASE, CHART_NS = "kvs", "kvserve-system"
SERVER = f"{RELEASE}-kvserve-operator-metrics-api"
OURS = f"{CHART_NS}/{SERVER}"
GROUP_PATH = "/apis/custom.metrics.k8s.io"


class PodMetrics:
    """A pod's ``/metrics`` on 127.0.0.1, its queue depth set by the test."""

    def __init__(self) -> None:
        self.body = b""
        self.set(0)
        metrics = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(metrics.body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, waiting: int, kv_usage: float = 0.25) -> None:
        metrics = ServerMetrics("m")
        metrics.on_step(SchedulerStats(1, waiting, kv_usage), [])
        metrics.snapshot.rebuild()  # a busy engine's /metrics: the server thread's snapshot
        self.body = metrics.exposition()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pod_metrics() -> Iterator[PodMetrics]:
    metrics = PodMetrics()
    yield metrics
    metrics.server.shutdown()


@pytest.fixture(scope="module")
def metrics_api(plane: ControlPlane) -> Iterator[int]:
    """The chart installed, its metrics API serving and Available; yields the server's port."""
    # Helm 4 applies server-side, on which kube-apiserver 1.20's aggregator panics for an
    # APIService: client-side apply.
    plane.helm(
        "install", RELEASE, str(ROOT / "charts" / "kvserve-operator"), "--namespace", CHART_NS,
        "--create-namespace", "--server-side=false",
    )  # fmt: skip
    core = client.CoreV1Api(plane.admin_client())
    secret = core.read_namespaced_secret(f"{SERVER}-tls", CHART_NS)
    certs = plane.state / "metrics-api-tls"
    certs.mkdir()
    for key in ("tls.crt", "tls.key"):
        (certs / key).write_bytes(base64.b64decode(secret.data[key]))
    apps = client.AppsV1Api(plane.admin_client())
    command = apps.read_namespaced_deployment(SERVER, CHART_NS).spec.template.spec.containers[0]
    port = _free_port()
    args = [a for a in command.command[3:] if not a.startswith(("--port=", "--cert-dir="))]
    kubeconfig = wait_for(
        lambda: plane.service_account_kubeconfig(CHART_NS, SERVER), "the metrics API's account"
    )
    log = (plane.state / "metrics-api.log").open("ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "kvserve.operator.metrics_api", f"--port={port}",
         f"--cert-dir={certs}", *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        plane.kubectl("delete", "service", SERVER, "-n", CHART_NS)
        plane.kubectl(
            "create", "service", "externalname", SERVER, "-n", CHART_NS,
            "--external-name", "localhost",
        )  # fmt: skip
        for version in ("v1beta1", "v1beta2"):
            port_patch = json.dumps({"spec": {"service": {"port": port}}})
            name = f"apiservice/{version}.custom.metrics.k8s.io"
            plane.kubectl("patch", name, "--type", "merge", "-p", port_patch)

        def available() -> bool:
            out = plane.kubectl("get", "apiservice", "-o", "json").stdout
            services = [s for s in json.loads(out)["items"] if s["spec"].get("group")]
            conditions = [
                c
                for s in services
                if s["spec"]["group"] == "custom.metrics.k8s.io"
                for c in s["status"].get("conditions", [])
                if c["type"] == "Available"
            ]
            return len(conditions) == 2 and all(c["status"] == "True" for c in conditions)

        wait_for(available, "both APIServices Available")
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _ready(plane: ControlPlane, ns: str, name: str, ready: bool = True) -> None:
    """Play the kubelet: the pod Running at 127.0.0.1, Ready or not."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {"type": "Ready", "status": str(ready), "lastTransitionTime": now}
    status = {"phase": "Running", "podIP": "127.0.0.1", "conditions": [condition]}
    client.CoreV1Api(plane.admin_client()).patch_namespaced_pod_status(name, ns, {"status": status})


def _pod(name: str, llmd: str, port: int) -> dict[str, Any]:
    container = {
        "name": "server",
        "image": "kvserve:test",
        "ports": [{"name": "http", "containerPort": port}],
    }
    return {"metadata": {"name": name, "labels": labels(llmd)}, "spec": {"containers": [container]}}


def _raw(plane: ControlPlane, path: str, kubeconfig: Path | None = None) -> dict[str, Any]:
    return json.loads(plane.kubectl("get", "--raw", path, kubeconfig=kubeconfig).stdout)


def test_per_pod_values_through_the_aggregation_layer(
    plane: ControlPlane, metrics_api: int, pod_metrics: PodMetrics
) -> None:
    ns = namespace(plane, "values")
    core = client.CoreV1Api(plane.admin_client())
    pod_metrics.set(3, 0.25)
    for name, owner in (("a", "demo"), ("b", "demo"), ("c", "other")):
        core.create_namespaced_pod(ns, _pod(name, owner, pod_metrics.port))
        _ready(plane, ns, name, ready=name != "b")
    selector = selector_string("demo")
    beta1 = _raw(
        plane,
        f"{GROUP_PATH}/v1beta1/namespaces/{ns}/pods/*/{WAITING_METRIC}?labelSelector={selector}",
    )
    beta2 = _raw(
        plane,
        f"{GROUP_PATH}/v1beta2/namespaces/{ns}/pods/*/{KV_USAGE_METRIC}?labelSelector={selector}",
    )
    pod = {"kind": "Pod", "namespace": ns, "name": "a", "apiVersion": "v1"}
    for item in beta1["items"] + beta2["items"]:
        assert item.pop("timestamp")
    assert beta1 == {
        "kind": "MetricValueList",
        "apiVersion": "custom.metrics.k8s.io/v1beta1",
        "metadata": {},
        "items": [
            {"describedObject": pod, "metricName": WAITING_METRIC, "value": "3", "selector": None}
        ],
    }
    assert beta2["items"] == [
        {"describedObject": pod, "metric": {"name": KV_USAGE_METRIC}, "value": "250m"}
    ]
    everything = _raw(plane, f"{GROUP_PATH}/v1beta1/namespaces/{ns}/pods/*/{WAITING_METRIC}")
    assert [i["describedObject"]["name"] for i in everything["items"]] == ["a", "c"]


def test_callers_need_rights_and_the_server_refuses_all_but_the_front_proxy(
    plane: ControlPlane, metrics_api: int
) -> None:
    ns = namespace(plane, "rights")
    plane.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    nobody = wait_for(lambda: plane.service_account_kubeconfig(ns, "nobody"), "nobody's token")
    path = f"{GROUP_PATH}/v1beta1/namespaces/{ns}/pods/*/{WAITING_METRIC}"
    out = plane.kubectl("get", "--raw", path, kubeconfig=nobody, check=False)
    assert out.returncode == 1 and "forbidden" in out.stderr.lower()
    # Straight to the server with a token, not through the front proxy: refused.
    token = plane.kubectl("create", "token", "nobody", "-n", ns).stdout.strip()
    direct = subprocess.run(
        ["curl", "-sk", "-H", f"Authorization: Bearer {token}",
         f"https://127.0.0.1:{metrics_api}{path}"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert json.loads(direct.stdout)["code"] == 401


def test_the_hpa_controller_scales_on_the_served_queue_depth(
    plane: ControlPlane, metrics_api: int, pod_metrics: PodMetrics
) -> None:
    ns = namespace(plane, "scaling")
    api = plane.admin_client()
    kube, apps, core = Kube(api), client.AppsV1Api(api), client.CoreV1Api(api)
    template = _pod("", "demo", pod_metrics.port)
    del template["metadata"]["name"]
    deployment = {
        "metadata": {"name": "demo", "labels": labels("demo")},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector_labels("demo")},
            "template": template,
        },
    }
    apps.create_namespaced_deployment(ns, deployment)
    scaling = AutoscalingSpec.model_validate(
        {"maxReplicas": 3, "targetWaitingRequests": 1, "scaleDownStabilizationSeconds": 0}
    )
    hpa = render_hpa(
        {"metadata": {"name": "demo", "namespace": ns, "uid": "-"}}, scaling, "autoscaling/v2beta2"
    )
    del hpa["metadata"]["ownerReferences"]  # no LLMDeployment here: the collector would take it
    kube.apply(hpa)

    def replicas_once_ready() -> int:
        for pod in core.list_namespaced_pod(ns).items:
            if pod.status.phase != "Running":
                _ready(plane, ns, pod.metadata.name)
        return apps.read_namespaced_deployment("demo", ns).spec.replicas

    def hpa_status() -> dict:
        return kube.get("autoscaling/v2beta2", "HorizontalPodAutoscaler", ns, "demo")["status"]

    pod_metrics.set(4)  # 4 waiting on one pod, target 1 per pod: 4 wanted, at most 3
    wait_for(lambda: replicas_once_ready() == 3, "the HPA to scale up to 3", timeout=90)
    # The controller writes the scale before its status, and a sync that found the new pods
    # without metrics yet writes no currentMetrics: the status catches up a sync later.
    status = wait_for(
        lambda: (s := hpa_status()).get("currentMetrics") and s, "the HPA's metrics", timeout=60
    )
    assert status["currentMetrics"] == [
        {
            "type": "Pods",
            "pods": {"metric": {"name": WAITING_METRIC}, "current": {"averageValue": "4"}},
        }
    ]
    active = next(c for c in status["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("True", "ValidMetricFound")
    pod_metrics.set(0)
    wait_for(lambda: replicas_once_ready() == 1, "the HPA to scale down to 1", timeout=90)


def test_the_operator_sees_whose_api_serves_the_group(
    plane: ControlPlane, metrics_api: int
) -> None:
    operator = plane.service_account_kubeconfig(CHART_NS, f"{RELEASE}-kvserve-operator")
    source = MetricsSource(config.new_client_from_config(str(operator)), ours=OURS)
    assert source.verdict() == (
        True,
        "KvserveMetricsAPI",
        f"the HPA reads its metrics from kvserve's metrics API ({OURS})",
    )
    stranger = MetricsSource(config.new_client_from_config(str(operator)), ours="other/kvserve")
    ok, reason, message = stranger.verdict()
    assert (ok, reason) == (False, "MetricsAPIConflict")
    assert message.startswith(
        "custom.metrics.k8s.io is served by APIService v1beta2.custom.metrics.k8s.io "
        f"(service {OURS}), APIService v1beta1.custom.metrics.k8s.io (service {OURS})"
    )


def test_a_second_install_leaves_the_taken_apiservices_alone(
    plane: ControlPlane, metrics_api: int
) -> None:
    out = plane.helm(
        "install", "second", str(ROOT / "charts" / "kvserve-operator"), "--namespace", "second",
        "--create-namespace", "--dry-run=server", "--server-side=false",
    ).stdout  # fmt: skip
    manifest, notes = out.split("NOTES:")
    docs = [d for d in yaml.safe_load_all(manifest.split("MANIFEST:")[1]) if d]
    assert "Deployment/second-kvserve-operator" in [
        f"{d['kind']}/{d['metadata']['name']}" for d in docs
    ]
    assert [
        d for d in docs if d["kind"] == "APIService" or "metrics-api" in d["metadata"]["name"]
    ] == []
    assert (
        "WARNING: custom.metrics.k8s.io is already served by APIService "
        f"v1beta2.custom.metrics.k8s.io (service {OURS}), APIService "
        f"v1beta1.custom.metrics.k8s.io (service {OURS}),\nwhich is not kvserve's"
    ) in notes


def test_autoscaled_llmdeployments_carry_the_custom_metrics_condition(
    plane: ControlPlane, metrics_api: int
) -> None:
    ns = namespace(plane, "condition")
    api = plane.admin_client()
    reconciler = Reconciler(Kube(api))
    reconciler.metrics = MetricsSource(api, ours=OURS)
    for sample in ("hf-gpu-autoscaled.yaml", "cpu-demo.yaml"):
        apply_yaml(plane, ns, load_sample(sample))
    scaled = reconciler.reconcile(llmd(Kube(api), ns, "qwen"))
    fixed = reconciler.reconcile(llmd(Kube(api), ns, "cpu-demo"))
    metrics = [c for c in scaled.status["conditions"] if c["type"] == "CustomMetrics"]
    assert [(c["status"], c["reason"], c["message"]) for c in metrics] == [
        (
            "True",
            "KvserveMetricsAPI",
            f"the HPA reads its metrics from kvserve's metrics API ({OURS})",
        )
    ]
    assert [c["type"] for c in fixed.status["conditions"]] == [
        "Available",
        "Progressing",
        "Degraded",
        "ModelLoaded",
    ]
