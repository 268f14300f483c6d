"""The namespaced install (``watchNamespaces``) on a real control plane, RBAC on: the operator,
as its ServiceAccount with only a Role in each watched namespace, serves those and no other."""

import pytest
import yaml
from kubernetes import client

from k8s.cluster_objects import (
    NO_METRICS_API,
    OPERATOR_NS,
    SERVICE_ACCOUNT,
    apply_yaml,
    children,
    condition,
    events_for,
    llmd,
    namespace,
    play_node,
    pod_monitor_crd,
)
from k8s.kube_cluster import ControlPlane, Operator, wait_for
from k8s.support import NEEDS_CLUSTER, load_sample
from kvserve.operator.kube import Kube

pytestmark = NEEDS_CLUSTER
WATCHED = ("team-a", "team-b")
SUBJECT = f"system:serviceaccount:{OPERATOR_NS}:{SERVICE_ACCOUNT}"


@pytest.fixture(scope="module")
def chart_values(plane: ControlPlane) -> list[str]:
    for ns in (*WATCHED, "unwatched"):
        namespace(plane, ns)
    return [*NO_METRICS_API, "--set", f"watchNamespaces={{{','.join(WATCHED)}}}"]


STRICT_POD_MONITOR_CRD = pod_monitor_crd(
    {"type": "object", "required": ["mustHave"], "x-kubernetes-preserve-unknown-fields": True}
)
"""A PodMonitor API whose schema refuses the PodMonitor the operator renders (422)."""


def _can(plane: ControlPlane, verb: str, resource: str, ns: str) -> str:
    out = plane.kubectl("auth", "can-i", verb, resource, "-n", ns, f"--as={SUBJECT}", check=False)
    return out.stdout.strip()


def test_operator_serves_only_its_namespaces(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    assert operator.args[:3] == ["--standalone", "--namespace=team-a", "--namespace=team-b"]
    for ns in (*WATCHED, "unwatched"):
        apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    for ns in WATCHED:
        wait_for(lambda n=ns: children(kube, n, "cpu-demo")["PodDisruptionBudget"], f"{ns}")
    wait_for(lambda: play_node(plane, "team-a", "cpu-demo") == 2, "two pods")
    wait_for(
        lambda: llmd(kube, "team-a", "cpu-demo")["status"].get("phase") == "Ready", "phase Ready"
    )
    before = children(kube, "team-b", "cpu-demo")["Service"]
    plane.kubectl("delete", "service", "cpu-demo", "-n", "team-b")
    again = wait_for(lambda: children(kube, "team-b", "cpu-demo")["Service"], "a new Service")
    assert again["metadata"]["uid"] != before["metadata"]["uid"]

    assert list(children(kube, "unwatched", "cpu-demo").values()) == [None] * 4
    assert "status" not in llmd(kube, "unwatched", "cpu-demo")
    rbac = client.RbacAuthorizationV1Api(plane.admin_client())
    assert [r.metadata.name for r in rbac.list_cluster_role_binding().items].count(
        SERVICE_ACCOUNT
    ) == 0
    assert _can(plane, "patch", "deployments", "team-a") == "yes"
    for ns in ("kube-system", "unwatched", "default"):
        assert _can(plane, "create", "deployments", ns) == "no"
        assert _can(plane, "patch", "services", ns) == "no"
    assert _can(plane, "get", "services", "team-a") == "no"


def test_resync_repairs_drift_without_a_finalizer(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    """A Deployment scaled by hand sends only status-refreshing events; the resync undoes it."""
    operator.stop()
    operator.env["KVSERVE_RESYNC_SECONDS"] = "2"
    operator.start()
    try:
        apply_yaml(plane, "team-b", {**load_sample("cpu-demo.yaml"), "metadata": {"name": "drift"}})
        wait_for(lambda: children(kube, "team-b", "drift")["Deployment"], "the Deployment")
        plane.kubectl("scale", "deployment", "drift", "-n", "team-b", "--replicas=5")
        wait_for(
            lambda: kube.get("apps/v1", "Deployment", "team-b", "drift")["spec"]["replicas"] == 2,
            "the resync to restore 2 replicas",
            30,
        )
        owner = llmd(kube, "team-b", "drift")
        assert "finalizers" not in owner["metadata"]
        assert condition(owner, "Degraded")["status"] == "False"

        # A PodMonitor API appears that refuses the operator's PodMonitor: no spec changed, so
        # only the resync sees it, and it posts the one Event (not one per round).
        plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(STRICT_POD_MONITOR_CRD))
        degraded = wait_for(
            lambda: (
                (c := condition(llmd(kube, "team-b", "drift"), "Degraded"))["status"] == "True"
                and c
            ),
            "the resync to report the refused PodMonitor",
            30,
        )
        assert degraded["reason"] == "ApplyFailed"
        assert "spec.mustHave: Required value" in degraded["message"]
        warning = {"type": "Warning", "reason": "ApplyFailed", "message": degraded["message"]}
        assert wait_for(lambda: events_for(plane, "team-b", "drift"), "the Event") == [warning]
        rounds = operator.text().count("PATCH /apis/monitoring.coreos.com/v1/namespaces/team-b/")
        wait_for(
            lambda: (
                operator.text().count("PATCH /apis/monitoring.coreos.com/v1/namespaces/team-b/")
                >= rounds + 3
            ),
            "three more resync rounds",
            30,
        )
        assert events_for(plane, "team-b", "drift") == [warning]
    finally:
        operator.stop()
        operator.env["KVSERVE_RESYNC_SECONDS"] = "3600"
        operator.start()
