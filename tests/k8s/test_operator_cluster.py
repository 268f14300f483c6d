"""The operator against a real kube-apiserver + kube-controller-manager (v1.20, RBAC on).

The operator runs under the chart's ServiceAccount, installed with ``helm install``. There is no
scheduler or kubelet: pods stay Pending, and where a test needs ready replicas it plays the
node by marking the pods Ready. Set KVSERVE_SKIP_K8S=1 to skip these tests explicitly; without
it, a control plane that cannot be built or started fails them.
"""

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from k8s.cluster_objects import (
    API,
    PLAYED_LOAD_SECONDS,
    apply_yaml,
    children,
    condition,
    cpu_group_sample,
    events_for,
    install_inference_pool_crd,
    llmd,
    namespace,
    play_node,
    pod_monitor_crd,
)
from k8s.kube_cluster import ControlPlane, Operator, wait_for
from k8s.support import NEEDS_CLUSTER, load_sample
from kvserve.operator.kube import Kube
from kvserve.operator.reconciler import IMAGE_ENV, Reconciler

pytestmark = NEEDS_CLUSTER


def test_apply_makes_children_and_status(plane: ControlPlane, operator: Operator, kube: Kube):
    ns = namespace(plane, "apply")
    apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    owner = llmd(kube, ns, "cpu-demo")
    assert owner is not None
    kids = wait_for(
        lambda: (c := children(kube, ns, "cpu-demo"))["PodDisruptionBudget"] and c, "the children"
    )
    assert kids["HorizontalPodAutoscaler"] is None
    for kind in ("Deployment", "Service", "PodDisruptionBudget"):
        (ref,) = kids[kind]["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["uid"], ref["controller"]) == (
            "LLMDeployment",
            owner["metadata"]["uid"],
            True,
        )
    pod = kids["Deployment"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "kvserve:test"
    assert pod["containers"][0]["args"][:3] == ["serve", "--model", "/opt/kvserve/models/demo"]
    assert kids["Service"]["spec"]["clusterIP"].startswith("10.96.")

    # The real ReplicaSet controller makes two Pending pods; the test plays their node.
    wait_for(lambda: play_node(plane, ns, "cpu-demo") == 2, "two pods")
    ready = wait_for(
        lambda: (b := llmd(kube, ns, "cpu-demo"))["status"].get("phase") == "Ready" and b,
        "phase Ready",
    )
    status = ready["status"]
    assert (status["replicas"], status["readyReplicas"], status["observedGeneration"]) == (2, 2, 1)
    assert status["endpoint"] == "http://cpu-demo.apply.svc:8000/v1"
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Available", "True", "MinimumReplicasAvailable"),
        ("Progressing", "False", "RolloutComplete"),
        ("Degraded", "False", "Reconciled"),
        ("ModelLoaded", "True", "Loaded"),
    ]
    assert status["modelLoadSeconds"] == PLAYED_LOAD_SECONDS
    table = plane.kubectl("get", "llmd", "-n", ns).stdout.split("\n")
    assert table[0].split() == ["NAME", "MODEL", "REPLICAS", "READY", "PHASE", "AGE"]
    assert table[1].split()[:5] == ["cpu-demo", "/opt/kvserve/models/demo", "2", "2", "Ready"]


def test_scale_subresource_and_spec_update(plane: ControlPlane, operator: Operator, kube: Kube):
    ns = namespace(plane, "scale")
    custom = client.CustomObjectsApi(plane.admin_client())
    body = load_sample("cpu-demo.yaml")
    custom.create_namespaced_custom_object("kvserve.io", "v1alpha1", ns, "llmdeployments", body)
    wait_for(lambda: children(kube, ns, "cpu-demo")["Deployment"], "the Deployment")

    plane.kubectl("scale", "llmd", "cpu-demo", "-n", ns, "--replicas=3")
    wait_for(
        lambda: kube.get("apps/v1", "Deployment", ns, "cpu-demo")["spec"]["replicas"] == 3,
        "3 replicas in the Deployment",
    )
    scale = json.loads(
        plane.kubectl(
            "get", "--raw", f"/apis/{API}/namespaces/{ns}/llmdeployments/cpu-demo/scale"
        ).stdout
    )
    assert scale["spec"] == {"replicas": 3}
    wait_for(
        lambda: (
            json.loads(
                plane.kubectl(
                    "get", "--raw", f"/apis/{API}/namespaces/{ns}/llmdeployments/cpu-demo/scale"
                ).stdout
            )["status"]
            == {
                "replicas": 3,
                "selector": "app.kubernetes.io/name=kvserve,kvserve.io/llmdeployment=cpu-demo",
            }
        ),
        "the scale subresource's status",
    )

    custom.patch_namespaced_custom_object(
        "kvserve.io",
        "v1alpha1",
        ns,
        "llmdeployments",
        "cpu-demo",
        {"spec": {"engine": {"maxNumSeqs": 8}, "drain": {"timeoutSeconds": 45}}},
    )
    dep = wait_for(
        lambda: (
            (d := kube.get("apps/v1", "Deployment", ns, "cpu-demo"))["metadata"]["generation"] == 3
            and d
        ),
        "the rolled Deployment",
    )
    pod = dep["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "8"
    assert args[args.index("--shutdown-timeout") + 1] == "45"
    assert pod["terminationGracePeriodSeconds"] == 65
    assert dep["spec"]["replicas"] == 3
    wait_for(
        lambda: llmd(kube, ns, "cpu-demo")["status"].get("observedGeneration") == 3,
        "observedGeneration 3",
    )


def test_autoscaling_hpa_by_discovery_and_removal(
    plane: ControlPlane, operator: Operator, kube: Kube
):
    ns = namespace(plane, "hpa")
    body = load_sample("hf-gpu-autoscaled.yaml")
    body["spec"]["autoscaling"]["minReplicas"] = 2
    apply_yaml(plane, ns, body)
    hpa = wait_for(lambda: children(kube, ns, "qwen")["HorizontalPodAutoscaler"], "the HPA")
    assert hpa["apiVersion"] == "autoscaling/v2beta2"
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    assert hpa["spec"]["metrics"][1]["pods"]["target"]["averageValue"] == "800m"
    dep = kube.get("apps/v1", "Deployment", ns, "qwen")
    assert dep["spec"]["replicas"] == 2
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["initContainers"]] == ["fetch-model"]

    body["spec"].pop("autoscaling")
    body["spec"]["replicas"] = 1
    apply_yaml(plane, ns, body)
    wait_for(
        lambda: children(kube, ns, "qwen")["HorizontalPodAutoscaler"] is None, "the HPA removed"
    )
    wait_for(
        lambda: kube.get("apps/v1", "Deployment", ns, "qwen")["spec"]["replicas"] == 1, "1 replica"
    )


@pytest.mark.parametrize(
    ("ns", "patch", "message"),
    [
        (
            "invalid-bounds",
            {"autoscaling": {"minReplicas": 5, "maxReplicas": 2, "targetWaitingRequests": 3}},
            "autoscaling.minReplicas (5) is greater than autoscaling.maxReplicas (2)",
        ),
        (
            "invalid-scheme",
            {"model": {"source": "s3://bucket/model"}},
            "model.source 's3://bucket/model': unknown scheme 's3' (use hf://, pvc:// or an "
            "absolute path inside the image)",
        ),
        (
            "refused-by-the-server",
            {
                "engine": {"tensorParallelSize": 2, "distributedExecutorBackend": "uni"},
                "resources": {"gpus": 2},
            },
            "kvserve serve would refuse to start: distributed_executor_backend uni runs one "
            "rank, not tensor_parallel_size 2; use mp",
        ),
        (
            "absurd-memory",
            {"resources": {"cpu": "2", "memory": "99999999Ei"}},
            "resources.memory '99999999Ei' is outside 512Mi..1Pi",
        ),
        (
            "owned-flags",
            {"extraArgs": ["--port", "9000", "--host=127.0.0.1", "--seed", "1"]},
            "spec.extraArgs may not set flags the operator renders: --port (always 8000), "
            "--host (always 0.0.0.0)",
        ),
        (
            "owned-port",
            {"extraArgs": ["--port=9000"]},
            "spec.extraArgs may not set flags the operator renders: --port (always 8000)",
        ),
        (
            "long-gpu-product",
            {"resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3-" + "x" * 42}},
            f"resources.gpuProduct {'NVIDIA-H100-80GB-HBM3-' + 'x' * 42!r} cannot be a label "
            "value: use at most 63 letters, digits, '-', '_' or '.', beginning and ending with "
            "a letter or digit",
        ),
        (
            "long-picker-name",
            {"gateway": {"inferencePool": {"endpointPickerRef": {"name": "e" * 64, "port": 1}}}},
            f"gateway.inferencePool.endpointPickerRef.name {'e' * 64!r} cannot name a Service: "
            "use a DNS-1035 label (a lowercase letter, then lowercase letters, digits or '-', "
            "not ending in '-', at most 63 characters)",
        ),
    ],
)
def test_invalid_spec_is_degraded_with_an_event(
    plane: ControlPlane, operator: Operator, kube: Kube, ns: str, patch: dict, message: str
):
    namespace(plane, ns)
    body = load_sample("cpu-demo.yaml")
    body["spec"].update(patch)
    apply_yaml(plane, ns, body)
    degraded = wait_for(lambda: condition(llmd(kube, ns, "cpu-demo"), "Degraded"), "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True",
        "InvalidSpec",
        message,
    )
    assert llmd(kube, ns, "cpu-demo")["status"]["phase"] == "Degraded"
    event = wait_for(lambda: events_for(plane, ns, "cpu-demo"), "the Event")
    assert event == [{"type": "Warning", "reason": "InvalidSpec", "message": message}]
    assert list(children(kube, ns, "cpu-demo").values()) == [None] * 4  # nothing applied

    # No retry storm: the handler succeeded once, with nothing left to retry.
    log = operator.text()
    assert log.count(f"[{ns}/cpu-demo] Handler 'reconcile' succeeded") == 1
    assert f"[{ns}/cpu-demo] Handler 'reconcile' failed" not in log

    plane.kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(load_sample("cpu-demo.yaml")))
    wait_for(lambda: children(kube, ns, "cpu-demo")["Deployment"], "the Deployment once fixed")
    wait_for(
        lambda: condition(llmd(kube, ns, "cpu-demo"), "Degraded")["status"] == "False",
        "Degraded False",
    )


def test_rejected_spec_is_degraded(plane: ControlPlane, operator: Operator, kube: Kube):
    ns = namespace(plane, "rejected")
    body = load_sample("cpu-demo.yaml")
    body["spec"]["env"] = [{"name": "not valid!", "value": "1"}]
    apply_yaml(plane, ns, body)
    degraded = wait_for(lambda: condition(llmd(kube, ns, "cpu-demo"), "Degraded"), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ApplyFailed")
    assert degraded["message"].startswith(
        'the API server rejected a child: Deployment.apps "cpu-demo" is invalid: '
        'spec.template.spec.containers[0].env[2].name: Invalid value: "not valid!"'
    )
    event = wait_for(lambda: events_for(plane, ns, "cpu-demo"), "the Event")
    assert event == [{"type": "Warning", "reason": "ApplyFailed", "message": degraded["message"]}]
    assert children(kube, ns, "cpu-demo")["Deployment"] is None


def test_deleted_child_is_recreated(plane: ControlPlane, operator: Operator, kube: Kube):
    ns = namespace(plane, "recreate")
    apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    before = wait_for(
        lambda: (c := children(kube, ns, "cpu-demo"))["PodDisruptionBudget"] and c, "the children"
    )
    for kind, resource in (("Service", "service"), ("PodDisruptionBudget", "pdb")):
        plane.kubectl("delete", resource, "cpu-demo", "-n", ns)
        again = wait_for(
            lambda k=kind: (
                (c := children(kube, ns, "cpu-demo")[k])
                and c["metadata"]["uid"] != before[k]["metadata"]["uid"]
                and c
            ),
            f"a new {kind}",
        )
        assert again["spec"]["selector"] == before[kind]["spec"]["selector"]


def _versions(kube: Kube, ns: str, name: str) -> dict[str, tuple[str, list]]:
    """Per child: its uid and what the operator's field manager last wrote, and when.

    (Controllers keep writing the children's status; only the operator's writes count here.)
    """
    return {
        kind: (
            c["metadata"]["uid"],
            [m for m in c["metadata"]["managedFields"] if m["manager"] == "kvserve-operator"],
        )
        for kind, c in children(kube, ns, name).items()
        if c is not None
    }


def test_reconcile_is_idempotent_and_restart_makes_no_duplicates(
    plane: ControlPlane, operator: Operator, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = namespace(plane, "restart")
    body = load_sample("hf-gpu-autoscaled.yaml")
    apply_yaml(plane, ns, body)
    wait_for(
        lambda: llmd(kube, ns, "qwen").get("status", {}).get("observedGeneration") == 1,
        "the first reconcile",
    )
    wait_for(lambda: len(_versions(kube, ns, "qwen")) == 4, "four children")
    wait_for(
        lambda: (
            condition(llmd(kube, ns, "qwen"), "Progressing")["message"]
            == "1/1 replicas updated, 0 ready, 1 in total"
        ),
        "the Deployment's pod in the status",
    )
    wait_for(
        lambda: f"[{ns}/qwen] Creation is processed" in operator.text(),
        "kopf to record the handled creation on the owner",
    )
    owner_version = wait_for(lambda: _settled_version(kube, ns, "qwen"), "the owner unchanged")
    before = _versions(kube, ns, "qwen")

    # Reconciling twice more, as the operator would (its permissions, its image), writes nothing.
    monkeypatch.setenv(IMAGE_ENV, operator.env[IMAGE_ENV])
    sa = Reconciler(Kube(client.ApiClient(_sa_configuration(operator.kubeconfig))))
    for _ in range(2):
        outcome = sa.reconcile(llmd(kube, ns, "qwen"))
        assert outcome.problem is None
        assert outcome.status == llmd(kube, ns, "qwen")["status"]
    assert _versions(kube, ns, "qwen") == before

    broken = load_sample("cpu-demo.yaml")
    broken["metadata"]["name"] = "broken"
    broken["spec"]["autoscaling"] = {"minReplicas": 3, "maxReplicas": 1, "targetWaitingRequests": 1}
    apply_yaml(plane, ns, broken)
    wait_for(lambda: len(events_for(plane, ns, "broken")) == 1, "the broken one's Event")

    operator.stop()
    logged = len(operator.text())
    operator.start()
    for name in ("qwen", "broken"):
        wait_for(
            lambda n=name: f"[{ns}/{n}] Handler 'reconcile' succeeded" in operator.text()[logged:],
            f"the restarted operator to resume {name}",
        )
    # Resuming reports a problem it has already reported only in the status, not as new Event.
    assert len(events_for(plane, ns, "broken")) == 1
    assert _versions(kube, ns, "qwen") == before
    assert llmd(kube, ns, "qwen")["metadata"]["resourceVersion"] == owner_version
    apps = client.AppsV1Api(plane.admin_client())
    deployments = apps.list_namespaced_deployment(ns).items
    assert [d.metadata.name for d in deployments] == ["qwen"]
    services = client.CoreV1Api(plane.admin_client()).list_namespaced_service(ns).items
    assert [s.metadata.name for s in services] == ["qwen"]


def _settled_version(kube: Kube, ns: str, name: str) -> str | None:
    """The owner's resourceVersion if it stays the same for a second (kopf's annotations and the
    status refreshes of the first reconcile are written by then)."""
    first = llmd(kube, ns, name)["metadata"]["resourceVersion"]
    time.sleep(1)
    return first if llmd(kube, ns, name)["metadata"]["resourceVersion"] == first else None


def _sa_configuration(kubeconfig: Path) -> client.Configuration:
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    return configuration


def test_delete_leaves_nothing_behind(plane: ControlPlane, operator: Operator, kube: Kube):
    ns = namespace(plane, "delete")
    body = load_sample("hf-gpu-autoscaled.yaml")
    apply_yaml(plane, ns, body)
    wait_for(lambda: len(_versions(kube, ns, "qwen")) == 4, "four children")
    apps = client.AppsV1Api(plane.admin_client())
    wait_for(lambda: apps.list_namespaced_replica_set(ns).items, "the ReplicaSet")
    plane.kubectl("delete", "llmd", "qwen", "-n", ns)

    def nothing_left() -> bool:
        core = client.CoreV1Api(plane.admin_client())
        return (
            not _versions(kube, ns, "qwen")
            and not apps.list_namespaced_replica_set(ns).items
            and not core.list_namespaced_pod(ns).items
        )

    wait_for(nothing_left, "the garbage collector to remove every child")


def test_a_crash_looping_pod_turns_model_loaded_false_with_one_event(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    """Only the pod's status changes (the Deployment's stays at 0 ready): the operator's pod
    watch refreshes the condition, and posts one Warning Event, not one per restart."""
    ns = namespace(plane, "crash")
    apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    core = client.CoreV1Api(plane.admin_client())
    pods = wait_for(lambda: len(p := core.list_namespaced_pod(ns).items) == 2 and p, "two pods")
    loading = wait_for(lambda: condition(llmd(kube, ns, "cpu-demo"), "ModelLoaded"), "ModelLoaded")
    assert (loading["status"], loading["reason"]) == ("Unknown", "Loading")
    victim = sorted(p.metadata.name for p in pods)[0]

    def crashed(restarts: int) -> dict[str, Any]:
        """The condition once the server of ``victim`` crashed ``restarts`` times."""
        ended = {"exitCode": 1, "reason": "Error",
                 "message": "loading\nValueError: bad config\n",
                 "startedAt": "2026-01-01T00:00:00Z",
                 "finishedAt": "2026-01-01T00:00:04Z"}  # fmt: skip
        server = {"name": "server", "ready": False, "restartCount": restarts,
                  "image": "kvserve:test", "imageID": "",
                  "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                  "lastState": {"terminated": ended}}  # fmt: skip
        body = {"status": {"phase": "Running", "containerStatuses": [server]}}
        core.patch_namespaced_pod_status(victim, ns, body)
        quoted = f"restarted {restarts} times"
        return wait_for(
            lambda: (
                (c := condition(llmd(kube, ns, "cpu-demo"), "ModelLoaded")) is not None
                and quoted in c["message"]
                and c
            ),
            f"ModelLoaded quoting {restarts} restarts",
        )

    failed = crashed(2)
    message = (
        f"1/2 pods failed to load; {victim}: container server exited with code 1 (Error), "
        "restarted 2 times: loading | ValueError: bad config"
    )
    assert (failed["status"], failed["reason"], failed["message"]) == ("False", "Error", message)
    warning = [{"type": "Warning", "reason": "Error", "message": message}]
    assert wait_for(lambda: events_for(plane, ns, "cpu-demo"), "the Event") == warning
    assert crashed(3)["message"] == message.replace("restarted 2", "restarted 3")
    assert events_for(plane, ns, "cpu-demo") == warning
    plane.kubectl("delete", "llmd", "cpu-demo", "-n", ns)


POOL_GATEWAY = {
    "inferencePool": {
        "name": "demo-pool",
        "endpointPickerRef": {"name": "demo-epp", "port": 9002, "failureMode": "FailOpen"},
    }
}
POOL_API = "inference.networking.k8s.io/v1"


def _gateway_sample() -> dict:
    body = load_sample("cpu-demo.yaml")
    body["spec"]["gateway"] = copy.deepcopy(POOL_GATEWAY)
    return body


def test_pool_without_its_api_is_a_condition_and_one_event(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    """Runs before the InferencePool CRD is installed (the last test)."""
    ns = namespace(plane, "no-pool-api")
    apply_yaml(plane, ns, _gateway_sample())
    pool = wait_for(lambda: condition(llmd(kube, ns, "cpu-demo"), "InferencePool"), "the condition")
    message = (
        "the spec asks for InferencePool demo-pool, but the cluster serves no "
        "inference.networking.k8s.io/v1 InferencePool API: install the Gateway API Inference "
        "Extension's CRDs (the pool is made at the next reconcile after that)"
    )
    assert (pool["status"], pool["reason"], pool["message"]) == (
        "False",
        "InferencePoolAPIMissing",
        message,
    )
    assert condition(llmd(kube, ns, "cpu-demo"), "Degraded")["status"] == "False"
    assert wait_for(lambda: children(kube, ns, "cpu-demo")["Deployment"], "the Deployment")
    warning = [{"type": "Warning", "reason": "InferencePoolAPIMissing", "message": message}]
    assert wait_for(lambda: events_for(plane, ns, "cpu-demo"), "the Event") == warning
    # Status refreshes from pod and Deployment events recompute the condition: no second Event.
    wait_for(lambda: play_node(plane, ns, "cpu-demo") == 2, "two pods")
    wait_for(
        lambda: condition(llmd(kube, ns, "cpu-demo"), "ModelLoaded")["status"] == "True",
        "ModelLoaded",
    )
    assert condition(llmd(kube, ns, "cpu-demo"), "InferencePool") == pool
    assert events_for(plane, ns, "cpu-demo") == warning


def test_group_without_its_api_is_a_condition_and_one_event(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    """A replica of two pods where the cluster serves no LeaderWorkerSet API: no workload, no
    HPA aimed at one; the Service and the PodDisruptionBudget are made."""
    ns = namespace(plane, "no-lws-api")
    apply_yaml(plane, ns, cpu_group_sample())
    group = wait_for(
        lambda: condition(llmd(kube, ns, "cpu-demo"), "LeaderWorkerSet"), "the condition"
    )
    message = (
        "each replica needs 2 pods, but the cluster serves no leaderworkerset.x-k8s.io/v1 "
        "LeaderWorkerSet API: install LeaderWorkerSet (its CRD and controller; the "
        "LeaderWorkerSet is made at the next reconcile after that)"
    )
    assert (group["status"], group["reason"], group["message"]) == (
        "False",
        "LeaderWorkerSetAPIMissing",
        message,
    )
    assert condition(llmd(kube, ns, "cpu-demo"), "Degraded")["status"] == "False"
    warning = [{"type": "Warning", "reason": "LeaderWorkerSetAPIMissing", "message": message}]
    assert wait_for(lambda: events_for(plane, ns, "cpu-demo"), "the Event") == warning
    kids = children(kube, ns, "cpu-demo")
    assert kids["PodDisruptionBudget"] is not None
    assert kids["Service"]["spec"]["selector"] == {
        "app.kubernetes.io/name": "kvserve",
        "kvserve.io/llmdeployment": "cpu-demo",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    assert (kids["Deployment"], kids["HorizontalPodAutoscaler"]) == (None, None)
    # A spec change reconciles again (and the status is recomputed): still one Event.
    custom = client.CustomObjectsApi(plane.admin_client())
    custom.patch_namespaced_custom_object(
        "kvserve.io", "v1alpha1", ns, "llmdeployments", "cpu-demo",
        {"spec": {"engine": {"maxNumSeqs": 8}}},
    )  # fmt: skip
    wait_for(
        lambda: llmd(kube, ns, "cpu-demo")["status"]["observedGeneration"] == 2,
        "the second reconcile",
    )
    assert condition(llmd(kube, ns, "cpu-demo"), "LeaderWorkerSet") == group
    assert events_for(plane, ns, "cpu-demo") == warning


POD_MONITOR_CRD = pod_monitor_crd({"type": "object", "x-kubernetes-preserve-unknown-fields": True})


def test_pod_monitor_once_the_prometheus_operator_api_exists(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    """Runs next to last: from here on the cluster serves monitoring.coreos.com (a stand-in)."""
    plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(POD_MONITOR_CRD))
    wait_for(
        lambda: plane.kubectl("get", "podmonitors", "-A", check=False).returncode == 0,
        "the PodMonitor API",
    )
    ns = namespace(plane, "monitored")
    apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    monitor = wait_for(
        lambda: kube.get("monitoring.coreos.com/v1", "PodMonitor", ns, "cpu-demo"), "the PodMonitor"
    )
    owner = llmd(kube, ns, "cpu-demo")
    assert monitor["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]
    assert monitor["spec"] == {
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "kvserve",
                "kvserve.io/llmdeployment": "cpu-demo",
            }
        },
        "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
    }
    plane.kubectl("delete", "llmd", "cpu-demo", "-n", ns)
    wait_for(
        lambda: kube.get("monitoring.coreos.com/v1", "PodMonitor", ns, "cpu-demo") is None,
        "the PodMonitor collected",
    )


def test_inference_pool_once_its_api_exists(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    """Runs last: the published InferencePool CRD installed; the operator's pool is accepted,
    renamed, and removed with the spec's gateway."""
    install_inference_pool_crd(plane)
    ns = namespace(plane, "gateway")
    apply_yaml(plane, ns, _gateway_sample())
    pool = wait_for(lambda: kube.get(POOL_API, "InferencePool", ns, "demo-pool"), "the pool")
    owner = llmd(kube, ns, "cpu-demo")
    (ref,) = pool["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == (
        "LLMDeployment",
        owner["metadata"]["uid"],
        True,
    )
    # As stored: the published schema's defaults (appProtocol, the picker's kind) filled in.
    assert pool["spec"] == {
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/name": "kvserve",
                "kvserve.io/llmdeployment": "cpu-demo",
            }
        },
        "targetPorts": [{"number": 8000}],
        "endpointPickerRef": {
            "name": "demo-epp",
            "kind": "Service",
            "port": {"number": 9002},
            "failureMode": "FailOpen",
        },
        "appProtocol": "http",
    }
    ready = wait_for(
        lambda: (
            (c := condition(llmd(kube, ns, "cpu-demo"), "InferencePool"))
            and c["status"] == "True"
            and c
        ),
        "the InferencePool condition True",
    )
    assert (ready["reason"], ready["message"]) == (
        "PoolApplied",
        "InferencePool demo-pool selects the pods on port 8000",
    )
    # The schema's own checks hold on 1.20: a pool without target ports is refused.
    bad = {"apiVersion": POOL_API, "kind": "InferencePool", "metadata": {"name": "bad"},
           "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []}}  # fmt: skip
    refused = plane.kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(bad), check=False)
    assert refused.returncode == 1 and "spec.targetPorts" in refused.stderr, refused.stderr

    rename = json.dumps({"spec": {"gateway": {"inferencePool": {"name": "demo-pool-2"}}}})
    plane.kubectl("patch", "llmd", "cpu-demo", "-n", ns, "--type=merge", "-p", rename)
    wait_for(lambda: kube.get(POOL_API, "InferencePool", ns, "demo-pool-2"), "the renamed pool")
    wait_for(
        lambda: kube.get(POOL_API, "InferencePool", ns, "demo-pool") is None, "the old pool gone"
    )
    remove = '[{"op": "remove", "path": "/spec/gateway"}]'
    plane.kubectl("patch", "llmd", "cpu-demo", "-n", ns, "--type=json", "-p", remove)
    wait_for(
        lambda: kube.get(POOL_API, "InferencePool", ns, "demo-pool-2") is None, "the pool gone"
    )
    wait_for(
        lambda: condition(llmd(kube, ns, "cpu-demo"), "InferencePool") is None,
        "the InferencePool condition gone",
    )
