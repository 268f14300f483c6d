"""Replicas of several pods against the real control plane (v1.20) with the published
LeaderWorkerSet CRD installed before the operator starts (so that it watches the kind).

No LWS controller runs here (nor a scheduler or kubelet): the tests play it where they need
to, by writing the LeaderWorkerSet's status as the controller would from its leaders' groups.
"""

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from k8s.cluster_objects import apply_yaml, condition, cpu_group_sample, llmd, namespace
from k8s.kube_cluster import ControlPlane, Operator, wait_for
from k8s.support import NEEDS_CLUSTER, leader_worker_set_crd
from kvserve.operator.children import desired_children
from kvserve.operator.discovery import discover
from kvserve.operator.kube import Kube
from kvserve.operator.validation import validated

pytestmark = NEEDS_CLUSTER

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
LWS_API = f"{GROUP}/{VERSION}"
LEADERS = {
    "app.kubernetes.io/name": "kvserve",
    "kvserve.io/llmdeployment": "cpu-demo",
    "leaderworkerset.sigs.k8s.io/worker-index": "0",
}
HPA_POD_SELECTOR = (
    "app.kubernetes.io/name=kvserve,kvserve.io/llmdeployment=cpu-demo,"
    "leaderworkerset.sigs.k8s.io/worker-index=0"
)


@pytest.fixture(scope="module")
def plane(plane: ControlPlane) -> Iterator[ControlPlane]:
    """The module's control plane with the LeaderWorkerSet CRD, before the operator starts.

    Created, not applied: kubectl's client-side apply would store the 650 kB object in its
    last-applied annotation, past the 256 kB limit on annotations."""
    plane.kubectl("create", "-f", "-", stdin=yaml.safe_dump(leader_worker_set_crd(for_1_20=True)))
    wait_for(
        lambda: plane.kubectl("get", PLURAL, "-A", check=False).returncode == 0,
        "the LeaderWorkerSet API",
    )
    yield plane


def _lws(kube: Kube, ns: str) -> dict[str, Any] | None:
    return kube.get(LWS_API, "LeaderWorkerSet", ns, "cpu-demo")


def _stored(kube: Kube, api_version: str, kind: str, ns: str) -> dict[str, Any]:
    found = kube.get(api_version, kind, ns, "cpu-demo")
    assert found is not None, kind
    return found


def test_group_applied_scaled_and_reported_from_its_leaders(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    ns = namespace(plane, "groups")
    apply_yaml(plane, ns, cpu_group_sample())
    lws = wait_for(lambda: _lws(kube, ns), "the LeaderWorkerSet")
    owner = llmd(kube, ns, "cpu-demo")
    assert owner is not None
    spec, source = validated(owner)
    rendered = next(
        c
        for c in desired_children(owner, spec, source, discover(kube.api), "kvserve:test", None)
        if c["kind"] == "LeaderWorkerSet"
    )
    assert lws["spec"] == rendered["spec"]
    assert lws["spec"]["replicas"] == 1
    (ref,) = lws["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"]) == ("LLMDeployment", owner["metadata"]["uid"])
    assert kube.get("apps/v1", "Deployment", ns, "cpu-demo") is None
    service = kube.get("v1", "Service", ns, "cpu-demo")
    assert service is not None and service["spec"]["selector"] == LEADERS
    hpa = wait_for(
        lambda: kube.get("autoscaling/v2beta2", "HorizontalPodAutoscaler", ns, "cpu-demo"),
        "the HPA",
    )
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "name": "cpu-demo",
    }

    # The HPA's path: the scale subresource of its target, read and written through the API.
    custom = client.CustomObjectsApi(plane.admin_client())
    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "cpu-demo")
    assert scale["spec"] == {"replicas": 1}
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, ns, PLURAL, "cpu-demo", {"spec": {"replicas": 2}}
    )
    assert _stored(kube, LWS_API, "LeaderWorkerSet", ns)["spec"]["replicas"] == 2

    # The controller's report: two groups, one whose leader and worker are all ready.
    status = {
        "replicas": 2,
        "readyReplicas": 1,
        "updatedReplicas": 2,
        "hpaPodSelector": HPA_POD_SELECTOR,
        "observedGeneration": _stored(kube, LWS_API, "LeaderWorkerSet", ns)["metadata"][
            "generation"
        ],
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, "cpu-demo", {"status": status}
    )
    scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "cpu-demo")
    assert scale["status"] == {"replicas": 2, "selector": HPA_POD_SELECTOR}
    reported = wait_for(
        lambda: (b := llmd(kube, ns, "cpu-demo"))["status"].get("readyReplicas") == 1 and b,
        "the groups' status in the LLMDeployment's",
    )["status"]
    assert (reported["phase"], reported["replicas"]) == ("Progressing", 2)
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in reported["conditions"]][
        :3
    ] == [
        ("Available", "True", "MinimumReplicasAvailable", "1/2 replicas ready"),
        ("Progressing", "True", "RollingOut", "2/2 replicas updated, 1 ready, 2 in total"),
        ("Degraded", "False", "Reconciled", "the spec is reconciled"),
    ]
    group = condition({"status": reported}, "LeaderWorkerSet")
    assert group is not None
    assert (group["status"], group["reason"], group["message"]) == (
        "True",
        "GroupsApplied",
        "each replica is a LeaderWorkerSet group of 2 pods",
    )

    # A spec change reconciles again and keeps the count the autoscaler set.
    custom.patch_namespaced_custom_object(
        "kvserve.io", "v1alpha1", ns, "llmdeployments", "cpu-demo",
        {"spec": {"engine": {"maxNumSeqs": 8}}},
    )  # fmt: skip
    rolled = wait_for(
        lambda: (w := _lws(kube, ns))["metadata"]["generation"] == 3 and w, "the rolled group"
    )
    assert rolled["spec"]["replicas"] == 2
    args = rolled["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "8"
    assert args[-1] == "--headless"


def test_switching_between_deployment_and_group_deletes_the_other(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    ns = namespace(plane, "switch")
    body = cpu_group_sample()
    apply_yaml(plane, ns, body)
    wait_for(lambda: _lws(kube, ns), "the LeaderWorkerSet")

    single = copy.deepcopy(body)
    del single["spec"]["resources"]["ranksPerPod"]
    apply_yaml(plane, ns, single)
    wait_for(lambda: kube.get("apps/v1", "Deployment", ns, "cpu-demo"), "the Deployment")
    wait_for(lambda: _lws(kube, ns) is None, "the LeaderWorkerSet deleted")
    service = kube.get("v1", "Service", ns, "cpu-demo")
    assert service is not None
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "kvserve",
        "kvserve.io/llmdeployment": "cpu-demo",
    }
    hpa = kube.get("autoscaling/v2beta2", "HorizontalPodAutoscaler", ns, "cpu-demo")
    assert hpa is not None and hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"

    apply_yaml(plane, ns, body)
    wait_for(lambda: _lws(kube, ns), "the LeaderWorkerSet again")
    wait_for(
        lambda: kube.get("apps/v1", "Deployment", ns, "cpu-demo") is None,
        "the Deployment deleted",
    )
    assert _stored(kube, "v1", "Service", ns)["spec"]["selector"] == LEADERS
