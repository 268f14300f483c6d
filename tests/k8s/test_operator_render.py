"""The children the operator renders, field by field, and valid for a current Kubernetes."""

import json
from typing import Any

import kubernetes_validate
import pytest

from k8s.support import CHILD_LABELS as LABELS
from k8s.support import K8S_SCHEMA_VERSION, OWNER_REF, ROOT, SAMPLES, owner
from kvserve.operator.children import desired_children, desired_replicas, obsolete_children
from kvserve.operator.deployment import FETCH_SCRIPT, serve_args
from kvserve.operator.discovery import ClusterApis
from kvserve.operator.spec import parse_spec

SELECTOR = {"app.kubernetes.io/name": "kvserve", "kvserve.io/llmdeployment": "qwen"}
METADATA = {
    "name": "qwen",
    "namespace": "ml",
    "labels": LABELS,
    "ownerReferences": [OWNER_REF],
}
CURRENT = ClusterApis()
HARDENED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def render(body: dict[str, Any], apis: ClusterApis = CURRENT, current: int | None = None):
    spec, source = parse_spec(body["spec"])
    children = desired_children(body, spec, source, apis, "kvserve:0.1.0", current)
    return {c["kind"]: c for c in children}


def test_hf_gpu_deployment_exact(hf_owner: dict[str, Any]) -> None:
    def probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": path, "port": "http"},
            "periodSeconds": period,
            "timeoutSeconds": timeout,
            "failureThreshold": failures,
        }

    assert render(hf_owner)["Deployment"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": METADATA,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": SELECTOR},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "progressDeadlineSeconds": 1800,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": LABELS,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "8000",
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 5 + 120 + 15,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "initContainers": [
                        {
                            "name": "fetch-model",
                            "image": "kvserve:0.1.0",
                            "command": ["python", "-c", FETCH_SCRIPT],
                            "args": ["Qwen/Qwen2.5-0.5B-Instruct", "main", "/models/model"],
                            "env": [
                                {"name": "HOME", "value": "/tmp"},
                                {"name": "HF_HOME", "value": "/tmp/hf"},
                                {
                                    "name": "HF_TOKEN",
                                    "valueFrom": {
                                        "secretKeyRef": {"name": "hf-token", "key": "token"}
                                    },
                                },
                                {"name": "KVSERVE_SEED", "value": "1"},
                            ],
                            "securityContext": HARDENED,
                            "volumeMounts": [
                                {"name": "model", "mountPath": "/models"},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                        }
                    ],
                    "containers": [
                        {
                            "name": "server",
                            "image": "kvserve:0.1.0",
                            "command": ["kvserve"],
                            "args": [
                                "serve",
                                "--model",
                                "/models/model",
                                "--served-model-name",
                                "qwen2.5-0.5b",
                                "--host",
                                "0.0.0.0",
                                "--port",
                                "8000",
                                "--device",
                                "cuda",
                                "--dtype",
                                "bfloat16",
                                "--tensor-parallel-size",
                                "1",
                                "--enable-prefix-caching",
                                "--shutdown-timeout",
                                "120",
                                "--max-num-seqs",
                                "128",
                                "--max-num-batched-tokens",
                                "4096",
                                "--max-model-len",
                                "8192",
                                "--long-prefill-token-threshold",
                                "512",
                                "--block-size",
                                "16",
                                "--gpu-memory-utilization",
                                "0.9",
                            ],
                            "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
                            "env": [
                                {"name": "HOME", "value": "/tmp"},
                                {"name": "OMP_NUM_THREADS", "value": "4"},
                                {
                                    "name": "KVSERVE_API_KEY",
                                    "valueFrom": {
                                        "secretKeyRef": {"name": "kvserve-api-key", "key": "key"}
                                    },
                                },
                                {"name": "KVSERVE_SEED", "value": "1"},
                            ],
                            "resources": {
                                "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                                "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                            },
                            "securityContext": HARDENED,
                            "volumeMounts": [
                                {"name": "shm", "mountPath": "/dev/shm"},
                                {"name": "tmp", "mountPath": "/tmp"},
                                {"name": "model", "mountPath": "/models", "readOnly": True},
                            ],
                            "startupProbe": probe("/health", 5, 3, 360),
                            "readinessProbe": probe("/ready", 5, 3, 2),
                            "livenessProbe": probe("/health", 10, 5, 3),
                            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                        }
                    ],
                    "volumes": [
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                        {"name": "tmp", "emptyDir": {}},
                        {"name": "model", "emptyDir": {}},
                    ],
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
                    "tolerations": [
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                },
            },
        },
    }


def test_the_fetch_script_is_fetch_model_and_imports_nothing_of_kvserve() -> None:
    assert (ROOT / "operator" / "fetch_model.py").read_text() == FETCH_SCRIPT
    imported = [
        line.split()[1]
        for line in FETCH_SCRIPT.splitlines()
        if line.startswith(("import ", "from "))
    ]
    assert imported == ["sys", "traceback", "pathlib", "huggingface_hub"]


def test_spec_env_reaches_the_download_and_replaces_its_own(hf_owner: dict[str, Any]) -> None:
    hf_owner["spec"]["env"] = [
        {"name": "HF_ENDPOINT", "value": "http://hub.invalid"},
        {"name": "HF_HOME", "value": "/tmp/hub"},
    ]
    pod = render(hf_owner)["Deployment"]["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert [(e["name"], e.get("value")) for e in fetch["env"]] == [
        ("HOME", "/tmp"),
        ("HF_HOME", "/tmp/hub"),
        ("HF_TOKEN", None),
        ("HF_ENDPOINT", "http://hub.invalid"),
    ]


def test_cpu_model_in_image() -> None:
    body = owner("cpu-demo.yaml")
    pod = render(body)["Deployment"]["spec"]["template"]["spec"]
    spec, source = parse_spec(body["spec"])
    assert serve_args("cpu-demo", spec, source) == [
        "serve",
        "--model", "/opt/kvserve/models/demo",
        "--served-model-name", "demo",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--device", "cpu",
        "--dtype", "float32",
        "--tensor-parallel-size", "1",
        "--enable-prefix-caching",
        "--shutdown-timeout", "30",
        "--max-num-seqs", "16",
        "--max-model-len", "1024",
    ]  # fmt: skip
    assert "initContainers" not in pod and "tolerations" not in pod and "nodeSelector" not in pod
    assert pod["terminationGracePeriodSeconds"] == 5 + 30 + 15
    assert pod["volumes"] == [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "2", "memory": "4Gi"},
    }
    assert render(body)["Deployment"]["spec"]["replicas"] == 2


def test_pvc_checkpoint() -> None:
    body = owner("pvc-llama-8b.yaml")
    pod = render(body)["Deployment"]["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["args"][:3] == ["serve", "--model", "/models/llama-3.1-8b-instruct"]
    assert server["args"][-9:] == [
        "--dtype", "bfloat16",
        "--tensor-parallel-size", "1",
        "--no-enable-prefix-caching",
        "--shutdown-timeout", "600",
        "--max-waiting-requests", "256",
    ]  # fmt: skip
    assert pod["volumes"] == [
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
    ]
    assert server["resources"] == {
        "requests": {"nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    ]
    assert pod["terminationGracePeriodSeconds"] == 5 + 600 + 15


def test_tool_call_parser_and_kv_events_exact() -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["model"]["servedName"] = "demo-chat"
    body["spec"]["engine"] = {
        "toolCallParser": "hermes",
        "kvEvents": {"enabled": True, "port": 5600},
    }
    server = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert server["args"][-5:] == [
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--kv-events-config",
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5600", '
        '"topic": "kv@$(POD_NAME)@demo-chat"}',
    ]  # fmt: skip
    assert server["env"] == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "OMP_NUM_THREADS", "value": "2"},
    ]
    assert server["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"name": "kv-events", "containerPort": 5600, "protocol": "TCP"},
    ]
    kubernetes_validate.validate(render(body)["Deployment"], K8S_SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize(
    "value, flag", [(True, "--async-scheduling"), (False, "--no-async-scheduling")]
)
def test_async_scheduling_renders_its_flag_only_when_set(value: bool, flag: str) -> None:
    body = owner("cpu-demo.yaml")
    plain = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    body["spec"]["engine"] = {**body["spec"].get("engine", {}), "asyncScheduling": value}
    args = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not {"--async-scheduling", "--no-async-scheduling"} & set(plain)
    assert args == [*plain, flag]


def test_kv_events_default_port_and_off_by_default() -> None:
    body = owner("cpu-demo.yaml")
    plain = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert not {"--kv-events-config", "--tool-call-parser"} & set(plain["args"])
    assert [p["name"] for p in plain["ports"]] == ["http"]
    body["spec"]["engine"] = {"kvEvents": {"enabled": True}}
    server = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    config = server["args"][server["args"].index("--kv-events-config") + 1]
    assert json.loads(config) == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "topic": "kv@$(POD_NAME)@demo",
    }
    assert server["ports"][1] == {"name": "kv-events", "containerPort": 5557, "protocol": "TCP"}


def test_speculative_config_exact() -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["engine"] = {
        "speculativeConfig": {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 3}
    }
    server = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert server["args"][-2:] == [
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}',
    ]
    plain = render(owner("cpu-demo.yaml"))["Deployment"]["spec"]["template"]["spec"]
    assert "--speculative-config" not in plain["containers"][0]["args"]


def test_user_env_replaces_ours_by_name() -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["env"] = [{"name": "HOME", "value": "/home/x"}, {"name": "A", "value": "1"}]
    env = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [
        {"name": "HOME", "value": "/home/x"},
        {"name": "OMP_NUM_THREADS", "value": "2"},
        {"name": "A", "value": "1"},
    ]


@pytest.mark.parametrize(
    ("cpu", "threads"), [("500m", "1"), ("1", "1"), ("1500m", "2"), ("2", "2"), ("0.25", "1")]
)
def test_cpu_limit_sets_the_thread_count(cpu: str, threads: str) -> None:
    """torch would size its thread pool by the node's cores, beyond what the CPU quota gives."""
    body = owner("cpu-demo.yaml")
    body["spec"]["resources"] = {"cpu": cpu, "memory": "1Gi"}
    env = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "HOME", "value": "/tmp"}, {"name": "OMP_NUM_THREADS", "value": threads}]


def test_no_cpu_limit_no_thread_count() -> None:
    body = owner("cpu-demo.yaml")
    body["spec"]["resources"] = {"memory": "1Gi"}
    env = render(body)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "HOME", "value": "/tmp"}]


def test_service_pdb_hpa_podmonitor_exact(hf_owner: dict[str, Any]) -> None:
    children = render(hf_owner, ClusterApis(pod_monitor=True))
    assert list(children) == [
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "PodMonitor"
    ]  # fmt: skip
    assert children["Service"] == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": METADATA,
        "spec": {
            "type": "ClusterIP",
            "selector": SELECTOR,
            "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    assert children["PodDisruptionBudget"] == {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": METADATA,
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": SELECTOR}},
    }
    assert children["HorizontalPodAutoscaler"] == {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": METADATA,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen"},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "vllm_num_requests_waiting"},
                        "target": {"type": "AverageValue", "averageValue": "5"},
                    },
                },
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "vllm_kv_cache_usage_perc"},
                        "target": {"type": "AverageValue", "averageValue": "800m"},
                    },
                },
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 120}},
        },
    }
    assert children["PodMonitor"] == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": METADATA,
        "spec": {
            "selector": {"matchLabels": SELECTOR},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def test_old_cluster_gets_beta_versions(hf_owner: dict[str, Any]) -> None:
    apis = ClusterApis(hpa_version="autoscaling/v2beta2", pdb_version="policy/v1beta1")
    children = render(hf_owner, apis)
    assert children["HorizontalPodAutoscaler"]["apiVersion"] == "autoscaling/v2beta2"
    assert children["PodDisruptionBudget"]["apiVersion"] == "policy/v1beta1"
    assert "PodMonitor" not in children
    # The oldest schemas shipped (1.25) still hold autoscaling/v2beta2; the real 1.20 API server
    # of the integration tests accepts both.
    kubernetes_validate.validate(children["HorizontalPodAutoscaler"], "1.25.0", strict=True)


@pytest.mark.parametrize(
    ("autoscaling", "current", "expected"),
    [
        (None, None, 2),
        (None, 7, 2),
        ({"minReplicas": 2, "maxReplicas": 5, "targetWaitingRequests": 1}, None, 2),
        ({"minReplicas": 2, "maxReplicas": 5, "targetWaitingRequests": 1}, 4, 4),
        ({"minReplicas": 2, "maxReplicas": 5, "targetWaitingRequests": 1}, 9, 5),
        ({"minReplicas": 2, "maxReplicas": 5, "targetWaitingRequests": 1}, 1, 2),
    ],
)
def test_desired_replicas(autoscaling: dict | None, current: int | None, expected: int) -> None:
    raw: dict[str, Any] = {"model": {"source": "/m"}, "replicas": 2}
    if autoscaling is not None:
        raw["autoscaling"] = autoscaling
    spec, _ = parse_spec(raw)
    assert desired_replicas(spec, current) == expected


def test_obsolete_hpa_only_without_operator_autoscaling() -> None:
    apis = ClusterApis(hpa_version="autoscaling/v2beta2")
    fixed, _ = parse_spec({"model": {"source": "/m"}})
    external, _ = parse_spec(
        {"model": {"source": "/m"}, "autoscaling": {"maxReplicas": 2, "controller": "External"}}
    )
    hpa, _ = parse_spec(
        {"model": {"source": "/m"}, "autoscaling": {"maxReplicas": 2, "targetWaitingRequests": 1}}
    )
    gone = [("autoscaling/v2beta2", "HorizontalPodAutoscaler")]
    assert obsolete_children(fixed, apis) == gone
    assert obsolete_children(external, apis) == gone
    assert obsolete_children(hpa, apis) == []


@pytest.mark.parametrize("sample", [p.name for p in SAMPLES])
def test_children_valid_for_current_kubernetes(sample: str) -> None:
    for child in render(owner(sample)).values():
        kubernetes_validate.validate(child, K8S_SCHEMA_VERSION, strict=True)


def test_invalid_child_is_caught_by_validation(hf_owner: dict[str, Any]) -> None:
    deployment = render(hf_owner)["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_SCHEMA_VERSION, strict=True)
