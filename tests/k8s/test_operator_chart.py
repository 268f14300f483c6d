"""The Helm charts: lint, render, validate every manifest, and hold the RBAC to what is used."""

import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from k8s.support import K8S_SCHEMA_VERSION, ROOT, KubeTools, crd_validator, load_crd
from kvserve.operator.autoscaler import KV_USAGE_METRIC, WAITING_METRIC
from kvserve.operator.children import grouped
from kvserve.operator.spec import parse_spec

OPERATOR_CHART = str(ROOT / "charts" / "kvserve-operator")
LLMD_CHART = str(ROOT / "charts" / "llmdeployment")


def template(tools: KubeTools, chart: str, *values: str) -> dict[str, dict[str, Any]]:
    """``helm template`` → {kind/name: manifest} (kind/namespace/name for a Role and binding)."""
    out = tools.helm_run("template", "demo", chart, "--namespace", "kvs", "--include-crds", *values)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return {_key(d): d for d in docs}


def _key(doc: dict[str, Any]) -> str:
    meta = doc["metadata"]
    if doc["kind"] in ("Role", "RoleBinding"):
        return f"{doc['kind']}/{meta['namespace']}/{meta['name']}"
    return f"{doc['kind']}/{meta['name']}"


RULES = [
    {"apiGroups": ["kvserve.io"], "resources": ["llmdeployments"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["kvserve.io"], "resources": ["llmdeployments/status"], "verbs": ["patch"]},
    {"apiGroups": ["apps"], "resources": ["deployments"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch", "create", "patch"]},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"],
     "verbs": ["list", "watch", "create", "patch"]},
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors"],
     "verbs": ["list", "watch", "create", "patch"]},
    {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
     "verbs": ["list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["leaderworkerset.x-k8s.io"], "resources": ["leaderworkersets"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": ["llm-d.ai", "inference.networking.x-k8s.io"],
     "resources": ["inferencemodelrewrites"], "verbs": ["list", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
]  # fmt: skip
"""Exactly what the operator calls: the SA-run cluster tests fail on any missing verb."""
LABELS = {
    "app.kubernetes.io/name": "kvserve-operator",
    "app.kubernetes.io/instance": "demo",
    "app.kubernetes.io/version": "0.1.0",
    "app.kubernetes.io/managed-by": "Helm",
    "helm.sh/chart": "kvserve-operator-0.1.0",
}
SUBJECTS = [{"kind": "ServiceAccount", "name": "demo-kvserve-operator", "namespace": "kvs"}]


@pytest.mark.parametrize(
    ("chart", "values"),
    [
        (OPERATOR_CHART, []),
        (OPERATOR_CHART, ["--set", "metricsAdapter.enabled=true"]),
        (OPERATOR_CHART, ["--set", "watchNamespaces={ml,serving}"]),
        (LLMD_CHART, []),
        (LLMD_CHART, ["--set", "keda.enabled=true,autoscaling.maxReplicas=3"]),
    ],
)
def test_lint_strict(kube_tools: KubeTools, chart: str, values: list[str]) -> None:
    out = kube_tools.helm_run("lint", "--strict", chart, *values)
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_operator_chart_manifests(kube_tools: KubeTools) -> None:
    values = "metricsAdapter.enabled=true,metricsAPI.enabled=false"  # the adapter mode
    docs = template(kube_tools, OPERATOR_CHART, "--set", values)
    assert sorted(docs) == [
        "ClusterRole/demo-kvserve-operator",
        "ClusterRoleBinding/demo-kvserve-operator",
        "ConfigMap/kvserve-adapter-rules",
        "CustomResourceDefinition/llmdeployments.kvserve.io",
        "Deployment/demo-kvserve-operator",
        "ServiceAccount/demo-kvserve-operator",
    ]
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
    assert docs["CustomResourceDefinition/llmdeployments.kvserve.io"] == load_crd()
    pod = docs["Deployment/demo-kvserve-operator"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-kvserve-operator"
    container = pod["containers"][0]
    assert container["image"] == "kvserve:0.1.0"
    assert container["command"] == [
        "python",
        "-m",
        "kopf",
        "run",
        "--standalone",
        "--all-namespaces",
        "--liveness=http://0.0.0.0:8080/healthz",
        "-m",
        "kvserve.operator.handlers",
    ]
    assert container["env"][:2] == [
        {"name": "KVSERVE_SERVING_IMAGE", "value": "kvserve:0.1.0"},
        {"name": "KVSERVE_RESYNC_SECONDS", "value": "300"},
    ]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    binding = docs["ClusterRoleBinding/demo-kvserve-operator"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "demo-kvserve-operator", "namespace": "kvs"}
    ]


def test_operator_is_ready_once_kopf_serves_its_health_endpoint(kube_tools: KubeTools) -> None:
    """Readiness and liveness both ask the endpoint the ``--liveness`` argument opens (kopf
    opens it after its startup handlers), on the port the container declares."""
    docs = template(kube_tools, OPERATOR_CHART)
    container = docs["Deployment/demo-kvserve-operator"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["command"]
    assert container["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 5,
        "failureThreshold": 3,
    }
    assert container["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 20,
        "failureThreshold": 3,
    }


def _rbac(docs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The operator's own RBAC (the metrics API's: tests/k8s/test_metrics_api_chart.py)."""
    return {
        k: v
        for k, v in docs.items()
        if v["apiVersion"] == "rbac.authorization.k8s.io/v1"
        and v["metadata"]["labels"].get("app.kubernetes.io/component") != "metrics-api"
    }


def test_cluster_wide_rbac_exact(kube_tools: KubeTools) -> None:
    name = "demo-kvserve-operator"
    assert _rbac(template(kube_tools, OPERATOR_CHART)) == {
        f"ClusterRole/{name}": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": LABELS},
            "rules": RULES,
        },
        f"ClusterRoleBinding/{name}": {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": LABELS},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": SUBJECTS,
        },
    }


def test_namespaced_rbac_and_command_exact(kube_tools: KubeTools) -> None:
    name = "demo-kvserve-operator"
    docs = template(kube_tools, OPERATOR_CHART, "--set", "watchNamespaces={ml,serving}")
    expected = {}
    for ns in ("ml", "serving"):
        meta = {"name": name, "namespace": ns, "labels": LABELS}
        expected[f"Role/{ns}/{name}"] = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": RULES,
        }
        expected[f"RoleBinding/{ns}/{name}"] = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": SUBJECTS,
        }
    assert _rbac(docs) == expected
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_SCHEMA_VERSION, strict=True)
    container = docs[f"Deployment/{name}"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "python", "-m", "kopf", "run", "--standalone", "--namespace=ml", "--namespace=serving",
        "--liveness=http://0.0.0.0:8080/healthz", "-m", "kvserve.operator.handlers",
    ]  # fmt: skip


def test_watch_namespaces_must_be_namespace_names(kube_tools: KubeTools) -> None:
    out = kube_tools.helm_run(
        "template", "demo", OPERATOR_CHART, "--set", "watchNamespaces={Bad_NS}", check=False
    )
    assert out.returncode == 1 and "/watchNamespaces/0" in out.stderr


def test_adapter_rules_name_the_metrics_the_hpa_uses(kube_tools: KubeTools) -> None:
    docs = template(kube_tools, OPERATOR_CHART, "--set", "metricsAdapter.enabled=true")
    config = yaml.safe_load(docs["ConfigMap/kvserve-adapter-rules"]["data"]["config.yaml"])
    (rule,) = config["rules"]
    series = re.search(r'__name__=~"(.*?)"', rule["seriesQuery"]).group(1)
    rename = rule["name"]
    exposed = {}
    for prom in ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert re.fullmatch(series, prom)
        exposed[prom] = re.sub(rename["matches"], rename["as"].replace("${1}", r"\1"), prom)
    assert exposed == {
        "vllm:num_requests_waiting": WAITING_METRIC,
        "vllm:kv_cache_usage_perc": KV_USAGE_METRIC,
    }
    assert rule["resources"] == {
        "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    }


def test_values_schema_rejects_unknown_and_wrong_values(kube_tools: KubeTools) -> None:
    out = kube_tools.helm_run(
        "template", "demo", OPERATOR_CHART, "--set", "resyncSeconds=1", check=False
    )
    assert out.returncode == 1
    assert "/resyncSeconds" in out.stderr and "minimum" in out.stderr
    out = kube_tools.helm_run("template", "demo", LLMD_CHART, "--set", "bogus=1", check=False)
    assert out.returncode == 1 and "additional properties 'bogus' not allowed" in out.stderr


def test_llmdeployment_chart_renders_a_valid_resource(kube_tools: KubeTools) -> None:
    docs = template(
        kube_tools,
        LLMD_CHART,
        "--set",
        "model.source=pvc://models/qwen,resources.gpus=1,engine.maxNumSeqs=32",
        "--set",
        "autoscaling.maxReplicas=4,autoscaling.targetWaitingRequests=3",
    )
    assert sorted(docs) == ["LLMDeployment/demo"]
    resource = docs["LLMDeployment/demo"]
    crd_validator().validate(resource)
    assert resource["spec"] == {
        "model": {"source": "pvc://models/qwen"},
        "replicas": 1,
        "autoscaling": {"maxReplicas": 4, "targetWaitingRequests": 3},
        "resources": {"gpus": 1},
        "engine": {"maxNumSeqs": 32},
        "extraArgs": [],
        "env": [],
        "drain": {"timeoutSeconds": 120},
    }
    parse_spec(resource["spec"])


def test_llmdeployment_chart_passes_a_gateway_and_engine_flags(kube_tools: KubeTools) -> None:
    docs = template(
        kube_tools,
        LLMD_CHART,
        "--set",
        "gateway.inferencePool.endpointPickerRef.name=epp,"
        "gateway.inferencePool.endpointPickerRef.port=9002",
        "--set",
        "engine.toolCallParser=hermes,engine.kvEvents.enabled=true",
    )
    resource = docs["LLMDeployment/demo"]
    crd_validator().validate(resource)
    assert resource["spec"]["gateway"] == {
        "inferencePool": {"endpointPickerRef": {"name": "epp", "port": 9002}}
    }
    assert resource["spec"]["engine"] == {"toolCallParser": "hermes", "kvEvents": {"enabled": True}}
    spec, _ = parse_spec(resource["spec"])
    assert spec.gateway.inference_pool is not None and spec.engine.kv_events.enabled


def test_keda_alternative(kube_tools: KubeTools) -> None:
    docs = template(
        kube_tools,
        LLMD_CHART,
        "--set",
        "keda.enabled=true,model.servedName=qwen",
        "--set",
        "autoscaling.minReplicas=2,autoscaling.maxReplicas=6",
    )
    assert docs["LLMDeployment/demo"]["spec"]["autoscaling"] == {
        "minReplicas": 2,
        "maxReplicas": 6,
        "controller": "External",
    }
    spec, _ = parse_spec(docs["LLMDeployment/demo"]["spec"])
    assert spec.autoscaling is not None and spec.autoscaling.controller == "External"
    assert docs["ScaledObject/demo"]["spec"] == {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo"},
        "minReplicaCount": 2,
        "maxReplicaCount": 6,
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}
            }
        },
        "triggers": [
            {
                "type": "prometheus",
                "metadata": {
                    "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
                    "query": 'sum(vllm:num_requests_waiting{namespace="kvs",model_name="qwen"})',
                    "threshold": "5",
                },
            }
        ],
    }


@pytest.mark.parametrize(
    ("values", "target"),
    [
        ("engine.tensorParallelSize=8,resources.gpus=8", ("apps/v1", "Deployment")),
        (
            "engine.tensorParallelSize=8,engine.pipelineParallelSize=2,resources.gpus=8",
            ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
        ),
        (
            "engine.tensorParallelSize=2,resources.ranksPerPod=1",
            ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
        ),
    ],
)
def test_keda_scales_the_workload_the_operator_renders(
    kube_tools: KubeTools, values: str, target: tuple[str, str]
) -> None:
    """A replica of several pods is a LeaderWorkerSet group: KEDA scales the groups."""
    docs = template(
        kube_tools, LLMD_CHART, "--set", f"keda.enabled=true,autoscaling.maxReplicas=3,{values}"
    )
    spec, _ = parse_spec(docs["LLMDeployment/demo"]["spec"])
    expected = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet") if grouped(spec) else None
    assert (expected or ("apps/v1", "Deployment")) == target
    ref = docs["ScaledObject/demo"]["spec"]["scaleTargetRef"]
    assert ref == {"apiVersion": target[0], "kind": target[1], "name": "demo"}
