"""A replica spanning several pods, rendered as a LeaderWorkerSet group: exact manifests."""

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from k8s.support import CHILD_LABELS as LABELS
from k8s.support import K8S_SCHEMA_VERSION, OWNER_REF, leader_worker_set_crd
from kvserve.operator.children import desired_children, obsolete_children
from kvserve.operator.discovery import ClusterApis
from kvserve.operator.spec import InvalidSpec, parse_spec, pods_per_replica
from kvserve.operator.validation import validated

LWS = ClusterApis(leader_worker_set=True)
SELECTOR = {"app.kubernetes.io/name": "kvserve", "kvserve.io/llmdeployment": "qwen"}
LEADERS = {**SELECTOR, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
METADATA = {"name": "qwen", "namespace": "ml", "labels": LABELS, "ownerReferences": [OWNER_REF]}
SCRAPE = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": "8000",
    "prometheus.io/path": "/metrics",
}
SERVE = [
    "serve",
    "--model", "/models/llama-405b",
    "--served-model-name", "llama-3.1-405b",
    "--host", "0.0.0.0",
    "--port", "8000",
    "--device", "cuda",
    "--dtype", "bfloat16",
    "--tensor-parallel-size", "8",
    "--enable-prefix-caching",
    "--shutdown-timeout", "600",
    "--pipeline-parallel-size", "2",
    "--nnodes", "$(LWS_GROUP_SIZE)",
    "--node-rank", "$(LWS_WORKER_INDEX)",
    "--master-addr", "$(LWS_LEADER_ADDRESS)",
    "--master-port", "29500",
]  # fmt: skip
"""The leader's flags; a worker's are the same and ``--headless``."""


def two_node_owner(**spec: Any) -> dict[str, Any]:
    """Llama-3.1-405B over two nodes of 8 GPUs: TP 8 inside a node, 2 pipeline stages across."""
    body: dict[str, Any] = {
        "apiVersion": "kvserve.io/v1alpha1",
        "kind": "LLMDeployment",
        "metadata": {"name": "qwen", "namespace": "ml", "uid": "uid-1", "generation": 1},
        "spec": {
            "model": {"source": "pvc://models/llama-405b", "servedName": "llama-3.1-405b"},
            "replicas": 3,
            "resources": {"gpus": 8, "memory": "1500Gi"},
            "engine": {"dtype": "bfloat16", "tensorParallelSize": 8, "pipelineParallelSize": 2},
            "drain": {"timeoutSeconds": 600},
        },
    }
    body["spec"].update(spec)
    return body


def render(body: dict[str, Any], apis: ClusterApis = LWS) -> dict[str, dict[str, Any]]:
    spec, source = validated(body)
    children = desired_children(body, spec, source, apis, "kvserve:0.1.0", None)
    return {c["kind"]: c for c in children}


def _probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _pod(server: dict[str, Any]) -> dict[str, Any]:
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 5 + 600 + 15,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [server],
        "volumes": [
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            {"name": "tmp", "emptyDir": {}},
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
            },
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }


def _server(args: list[str]) -> dict[str, Any]:
    amounts = {"memory": "1500Gi", "nvidia.com/gpu": "8"}
    return {
        "name": "server",
        "image": "kvserve:0.1.0",
        "command": ["kvserve"],
        "args": args,
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": {"requests": amounts, "limits": amounts},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "model", "mountPath": "/models", "readOnly": True},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def test_leader_worker_set_exact() -> None:
    leader = {
        **_server(SERVE),
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "startupProbe": _probe("/health", period=5, timeout=3, failures=360),
        "readinessProbe": _probe("/ready", period=5, timeout=3, failures=2),
        "livenessProbe": _probe("/health", period=10, timeout=5, failures=3),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
    }
    assert render(two_node_owner())["LeaderWorkerSet"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": METADATA,
        "spec": {
            "replicas": 3,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": LABELS, "annotations": SCRAPE},
                    "spec": _pod(leader),
                },
                "workerTemplate": {
                    "metadata": {"labels": LABELS},
                    "spec": _pod(_server([*SERVE, "--headless"])),
                },
            },
        },
    }


def test_service_pool_and_hpa_follow_the_leaders() -> None:
    children = render(
        two_node_owner(
            autoscaling={"minReplicas": 1, "maxReplicas": 4, "targetWaitingRequests": 8},
            gateway={"inferencePool": {}},
        ),
        ClusterApis(leader_worker_set=True, inference_pool=True),
    )
    assert list(children) == [
        "LeaderWorkerSet", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
        "InferencePool",
    ]  # fmt: skip
    assert children["Service"]["spec"] == {
        "type": "ClusterIP",
        "selector": LEADERS,
        "ports": [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}],
    }
    assert children["InferencePool"]["spec"] == {
        "selector": {"matchLabels": LEADERS},
        "targetPorts": [{"number": 8000}],
    }
    assert children["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "qwen",
    }
    # Every pod of a group, leaders and workers, is one disruption among the LLMDeployment's.
    assert children["PodDisruptionBudget"]["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": SELECTOR},
    }
    assert children["LeaderWorkerSet"]["spec"]["replicas"] == 1


def test_hf_model_is_downloaded_by_every_pod_of_the_group() -> None:
    lws = render(two_node_owner(model={"source": "hf://meta-llama/Llama-3.1-405B-Instruct"}))
    templates = lws["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        pod = templates[role]["spec"]
        (fetch,) = pod["initContainers"]
        assert fetch["name"] == "fetch-model"
        assert fetch["args"] == ["meta-llama/Llama-3.1-405B-Instruct", "", "/models/model"]
        assert {"name": "model", "emptyDir": {}} in pod["volumes"]
        assert pod["containers"][0]["args"][1:3] == ["--model", "/models/model"]


def test_cpu_group_of_one_rank_per_pod() -> None:
    """Two CPU pods as one TP=2 model (the real node's scenario): ``ranksPerPod`` 1."""
    body = two_node_owner(
        model={"source": "/opt/kvserve/models/demo"},
        replicas=1,
        resources={"ranksPerPod": 1, "cpu": "1", "memory": "2Gi"},
        engine={"tensorParallelSize": 2},
    )
    templates = render(body)["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    assert templates["size"] == 2
    leader = templates["leaderTemplate"]["spec"]
    worker = templates["workerTemplate"]["spec"]
    assert leader["containers"][0]["args"] == [
        "serve",
        "--model", "/opt/kvserve/models/demo",
        "--served-model-name", "qwen",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--device", "cpu",
        "--dtype", "auto",
        "--tensor-parallel-size", "2",
        "--enable-prefix-caching",
        "--shutdown-timeout", "600",
        "--nnodes", "$(LWS_GROUP_SIZE)",
        "--node-rank", "$(LWS_WORKER_INDEX)",
        "--master-addr", "$(LWS_LEADER_ADDRESS)",
        "--master-port", "29500",
    ]  # fmt: skip
    assert worker["containers"][0]["args"] == [*leader["containers"][0]["args"], "--headless"]
    assert leader["volumes"][0] == {
        "name": "shm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"},
    }
    assert worker["containers"][0]["env"] == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "OMP_NUM_THREADS", "value": "1"},
    ]


@pytest.mark.parametrize(
    ("tp", "pp", "res", "pods"),
    [
        (8, 1, {"gpus": 8}, 1),
        (8, 2, {"gpus": 8}, 2),
        (16, 1, {"gpus": 8}, 2),
        (4, 4, {"gpus": 4}, 4),
        (2, 1, {}, 1),
        (2, 1, {"ranksPerPod": 1}, 2),
        (1, 2, {"ranksPerPod": 1}, 2),
    ],
)
def test_pods_per_replica(tp: int, pp: int, res: dict[str, int], pods: int) -> None:
    spec, _ = parse_spec(
        {
            "model": {"source": "/m"},
            "engine": {"tensorParallelSize": tp, "pipelineParallelSize": pp},
            "resources": res,
        }
    )
    assert pods_per_replica(spec) == pods


def test_one_pod_per_replica_stays_a_deployment_with_its_pipeline_flag() -> None:
    children = render(
        two_node_owner(
            resources={"gpus": 8}, engine={"tensorParallelSize": 4, "pipelineParallelSize": 2}
        )
    )
    assert list(children) == ["Deployment", "Service", "PodDisruptionBudget"]
    args = children["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--pipeline-parallel-size", "2"]
    assert "--nnodes" not in args
    assert children["Service"]["spec"]["selector"] == SELECTOR


def test_without_the_api_no_workload_and_no_hpa() -> None:
    """The condition says why; the Service selects the leaders the spec asks for (a controller
    played by hand, as on the e2e node, serves behind it)."""
    scaled = two_node_owner(autoscaling={"maxReplicas": 2, "targetWaitingRequests": 1})
    children = render(scaled, ClusterApis())
    assert list(children) == ["Service", "PodDisruptionBudget"]
    assert children["Service"]["spec"]["selector"] == LEADERS


def test_switching_kinds_deletes_the_other() -> None:
    group, _ = parse_spec(two_node_owner()["spec"])
    single, _ = parse_spec(two_node_owner(engine={"tensorParallelSize": 8})["spec"])
    hpa = ("autoscaling/v2", "HorizontalPodAutoscaler")
    assert obsolete_children(group, LWS) == [hpa, ("apps/v1", "Deployment")]
    assert obsolete_children(single, LWS) == [
        hpa,
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
    ]
    assert obsolete_children(group, ClusterApis()) == [hpa]
    assert obsolete_children(single, ClusterApis()) == [hpa]


def test_adapters_are_refused_for_a_group() -> None:
    body = two_node_owner(adapters=[{"name": "sql", "source": "hf://org/sql-lora"}])
    with pytest.raises(InvalidSpec) as e:
        validated(body)
    assert str(e.value) == (
        "adapters are not served by a replica of 2 pods (a LeaderWorkerSet group) yet: serve "
        "them from replicas of one pod"
    )


def test_leader_worker_set_passes_the_published_schema() -> None:
    lws = render(two_node_owner(model={"source": "hf://org/name"}))["LeaderWorkerSet"]
    schema = leader_worker_set_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator(schema).validate(lws)
    for role in ("leaderTemplate", "workerTemplate"):
        template = lws["spec"]["leaderWorkerTemplate"][role]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"]}
        kubernetes_validate.validate(
            {**pod, "spec": template["spec"]}, K8S_SCHEMA_VERSION, strict=True
        )
    broken = copy.deepcopy(lws)
    broken["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(broken)


def test_vendored_crd_is_the_published_v1_with_its_scale_subresource() -> None:
    crd = leader_worker_set_crd()
    kubernetes_validate.validate(crd, K8S_SCHEMA_VERSION, strict=True)
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
    assert version["subresources"]["scale"] == {
        "labelSelectorPath": ".status.hpaPodSelector",
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
    }
    assert "'default': ''" in str(crd)
    assert "'default': ''" not in str(leader_worker_set_crd(for_1_20=True))
