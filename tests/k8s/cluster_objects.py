"""What the cluster tests read and write: namespaces, LLMDeployments, their children, Events,
the operator chart's install, and the node the tests play."""

import time
from typing import Any

import yaml
from kubernetes import client

from k8s.kube_cluster import ControlPlane, Operator, kopf_run_args, wait_for
from k8s.support import ROOT, inference_pool_crd, load_sample
from kvserve.operator.kube import Kube

API = "kvserve.io/v1alpha1"
OPERATOR_NS = "kvserve-system"
RELEASE = "kvs"
SERVICE_ACCOUNT = f"{RELEASE}-kvserve-operator"


NO_METRICS_API = ["--set", "metricsAPI.enabled=false"]
"""The chart's metrics API is an aggregated APIService whose pod never runs here (no kubelet):
unavailable, it would fail discovery and hold every namespace deletion. tests/metrics_api
tests it; these tests hold the operator."""


def denials(log: str) -> list[str]:
    """Log lines of refused API calls, but for the refusals the tests cause on purpose: a
    namespace being deleted and an exhausted quota. (RBAC denials read "... is forbidden: User
    ... cannot ..."; kopf's own say "Forbidden".)"""
    expected = ("because it is being terminated", "exceeded quota")
    return [
        line
        for line in log.splitlines()
        if "forbidden" in line.lower() and not any(e in line for e in expected)
    ]


def install_operator(plane: ControlPlane, values: list[str]) -> Operator:
    """``helm install`` the operator chart; the Operator runs as its ServiceAccount, with the
    kopf arguments of the Deployment the chart made (nothing runs that Deployment's pod)."""
    plane.helm(
        "install",
        RELEASE,
        str(ROOT / "charts" / "kvserve-operator"),
        "--namespace",
        OPERATOR_NS,
        "--create-namespace",
        *values,
    )
    wait_for(
        lambda: (
            plane.kubectl("get", "crd", "llmdeployments.kvserve.io", check=False).returncode == 0
        ),
        "the CRD",
    )
    kubeconfig = wait_for(
        lambda: (
            plane.kubectl("get", "sa", SERVICE_ACCOUNT, "-n", OPERATOR_NS, check=False).returncode
            == 0
            and plane.service_account_kubeconfig(OPERATOR_NS, SERVICE_ACCOUNT)
        ),
        "the operator's ServiceAccount",
    )
    apps = client.AppsV1Api(plane.admin_client())
    chart = apps.read_namespaced_deployment(SERVICE_ACCOUNT, OPERATOR_NS)
    args = kopf_run_args(chart.spec.template.spec.containers[0].command)
    return Operator(kubeconfig, plane.state / "operator.log", args)


def namespace(plane: ControlPlane, name: str) -> str:
    plane.kubectl("create", "namespace", name)
    wait_for(
        lambda: plane.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        f"the default ServiceAccount of {name}",
    )
    return name


def llmd(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    return kube.get(API, "LLMDeployment", ns, name)


def condition(body: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def children(kube: Kube, ns: str, name: str, hpa: str = "autoscaling/v2beta2") -> dict:
    """The children by kind, None where absent (v1.20 serves the beta HPA and PDB)."""
    return {
        "Deployment": kube.get("apps/v1", "Deployment", ns, name),
        "Service": kube.get("v1", "Service", ns, name),
        "PodDisruptionBudget": kube.get("policy/v1beta1", "PodDisruptionBudget", ns, name),
        "HorizontalPodAutoscaler": kube.get(hpa, "HorizontalPodAutoscaler", ns, name),
    }


def cpu_group_sample() -> dict[str, Any]:
    """The CPU demo as one TP=2 model over two pods of one rank each (a LeaderWorkerSet group),
    scaled by the HPA."""
    body = load_sample("cpu-demo.yaml")
    body["spec"].pop("replicas")
    body["spec"]["engine"]["tensorParallelSize"] = 2
    body["spec"]["resources"]["ranksPerPod"] = 1
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 3, "targetWaitingRequests": 4}
    return body


def apply_yaml(plane: ControlPlane, ns: str, body: dict[str, Any]) -> None:
    plane.kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(body))


def events_for(plane: ControlPlane, ns: str, name: str) -> list[dict[str, Any]]:
    """The Events about the LLMDeployment ``name`` (not about its children)."""
    core = client.CoreV1Api(plane.admin_client())
    where = f"involvedObject.kind=LLMDeployment,involvedObject.name={name}"
    found = core.list_namespaced_event(ns, field_selector=where).items
    return [{"type": e.type, "reason": e.reason, "message": e.message} for e in found]


PLAYED_LOAD_SECONDS = 12
"""How long before Ready ``play_node`` says each server container started."""


def play_node(plane: ControlPlane, ns: str, name: str) -> int:
    """Mark every pod of ``name`` Running and Ready, its server container started
    ``PLAYED_LOAD_SECONDS`` earlier, as a kubelet would; return how many."""
    core = client.CoreV1Api(plane.admin_client())
    pods = core.list_namespaced_pod(ns, label_selector=f"kvserve.io/llmdeployment={name}").items
    now = time.time()
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    ready_at = time.strftime(stamp, time.gmtime(now))
    started = time.strftime(stamp, time.gmtime(now - PLAYED_LOAD_SECONDS))
    for pod in pods:
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": ready_at}
        server = {"name": "server", "ready": True, "restartCount": 0, "image": "kvserve:test",
                  "imageID": "", "state": {"running": {"startedAt": started}}}  # fmt: skip
        body = {
            "status": {"phase": "Running", "conditions": [ready], "containerStatuses": [server]}
        }
        core.patch_namespaced_pod_status(pod.metadata.name, ns, body)
    return len(pods)


def pod_monitor_crd(spec_schema: dict[str, Any]) -> dict[str, Any]:
    """A stand-in for the Prometheus operator's PodMonitor CRD, its ``spec`` as given."""
    schema = {"type": "object", "properties": {"spec": spec_schema}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "podmonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def install_inference_pool_crd(plane: ControlPlane) -> None:
    """The published InferencePool CRD, as far as the v1.20 API server takes it."""
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(inference_pool_crd(for_1_20=True)))
    wait_for(
        lambda: plane.kubectl("get", "inferencepools", "-A", check=False).returncode == 0,
        "the InferencePool API",
    )
