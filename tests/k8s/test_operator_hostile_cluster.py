"""The operator where hostile testing broke it, on a real v1.20 control plane (RBAC on).

Names no Service can have, a status computed from a stale read, deletion while the operator is
down, a transient API error on re-creating a deleted child, a namespace being deleted.
"""

import logging
from types import SimpleNamespace

import pytest
from kubernetes import client, config

from k8s.cluster_objects import (
    apply_yaml,
    children,
    condition,
    events_for,
    llmd,
    namespace,
    play_node,
)
from k8s.kube_cluster import ControlPlane, Operator, wait_for
from k8s.support import NEEDS_CLUSTER, load_sample
from kvserve.operator import handlers
from kvserve.operator.kube import Kube
from kvserve.operator.reconciler import IMAGE_ENV, Reconciler
from kvserve.operator.status import reported_problem
from kvserve.operator.status_write import write_outcome

pytestmark = NEEDS_CLUSTER
KOPF_FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def _as_operator(operator: Operator, monkeypatch: pytest.MonkeyPatch) -> Reconciler:
    """A Reconciler with the operator's ServiceAccount and image, as a second handler."""
    monkeypatch.setenv(IMAGE_ENV, operator.env[IMAGE_ENV])
    configuration = client.Configuration()
    config.load_kube_config(str(operator.kubeconfig), client_configuration=configuration)
    return Reconciler(Kube(client.ApiClient(configuration)))


@pytest.mark.parametrize(
    ("ns", "name"),
    [
        ("name-digit", "1model"),
        ("name-dot", "with.dot"),
        # Longer than a label value: a selector built from it is refused by the API server.
        ("name-64", "a" * 64),
        ("name-253", "a" * 253),
    ],
)
def test_name_no_service_can_have_is_degraded_before_anything_is_applied(
    plane: ControlPlane, operator: Operator, kube: Kube, ns: str, name: str
) -> None:
    namespace(plane, ns)
    body = load_sample("cpu-demo.yaml")
    body["metadata"]["name"] = name
    apply_yaml(plane, ns, body)
    degraded = wait_for(lambda: condition(llmd(kube, ns, name), "Degraded"), "Degraded")
    message = (
        f"metadata.name {name!r} cannot name a Service: use a DNS-1035 label (a lowercase "
        "letter, then lowercase letters, digits or '-', not ending in '-', at most 63 characters)"
    )
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True",
        "InvalidName",
        message,
    )
    status = llmd(kube, ns, name)["status"]
    assert status["phase"] == "Degraded" and "endpoint" not in status
    event = wait_for(lambda: events_for(plane, ns, name), "the Event")
    assert event == [{"type": "Warning", "reason": "InvalidName", "message": message}]
    assert list(children(kube, ns, name).values()) == [None] * 4
    apps = client.AppsV1Api(plane.admin_client())
    assert apps.list_namespaced_deployment(ns).items == []
    # No retry storm: the handler succeeded once, with nothing left to retry.
    log = operator.text()
    assert log.count(f"[{ns}/{name}] Handler 'reconcile' succeeded") == 1
    assert f"[{ns}/{name}] Handler 'reconcile' failed" not in log


def test_longest_name_is_served(plane: ControlPlane, operator: Operator, kube: Kube) -> None:
    ns = namespace(plane, "name-63")
    name = "a" + "-0" * 31
    body = load_sample("cpu-demo.yaml")
    body["metadata"]["name"] = name
    apply_yaml(plane, ns, body)
    wait_for(lambda: children(kube, ns, name)["Deployment"], "the Deployment")
    degraded = wait_for(lambda: condition(llmd(kube, ns, name), "Degraded"), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "Reconciled")
    found = children(kube, ns, name)
    assert [kind for kind, child in found.items() if child is not None] == [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]
    assert llmd(kube, ns, name)["status"]["endpoint"] == f"http://{name}.{ns}.svc:8000/v1"
    assert events_for(plane, ns, name) == []


def test_status_from_a_stale_read_never_replaces_a_newer_one(
    plane: ControlPlane, operator: Operator, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = namespace(plane, "stale")
    body = load_sample("cpu-demo.yaml")
    apply_yaml(plane, ns, body)
    wait_for(
        lambda: (condition(llmd(kube, ns, "cpu-demo"), "Degraded") or {}).get("status") == "False",
        "the first reconcile",
    )
    stale = llmd(kube, ns, "cpu-demo")  # what a child event's handler read, just before ...
    body["spec"]["autoscaling"] = {"minReplicas": 3, "maxReplicas": 1, "targetWaitingRequests": 1}
    apply_yaml(plane, ns, body)  # ... the spec broke and the operator wrote Degraded=True
    wait_for(
        lambda: condition(llmd(kube, ns, "cpu-demo"), "Degraded")["status"] == "True", "Degraded"
    )
    wait_for(lambda: play_node(plane, ns, "cpu-demo") == 2, "two pods")  # the status changes
    fresh = wait_for(
        lambda: (b := llmd(kube, ns, "cpu-demo"))["status"]["readyReplicas"] == 2 and b,
        "the ready pods in the status",
    )
    assert len(events_for(plane, ns, "cpu-demo")) == 1
    problem = (
        "InvalidSpec",
        "autoscaling.minReplicas (3) is greater than autoscaling.maxReplicas (1)",
    )
    assert reported_problem(fresh) == problem

    # The late handler writes what it computed from the stale read (Degraded=False): the write
    # is refused, the status computed again from the owner as it is now: what is already there.
    reconciler = _as_operator(operator, monkeypatch)
    assert reconciler.status(stale).status != stale["status"]
    before, outcome = write_outcome(reconciler.kube, stale, reconciler.status)
    assert before["metadata"]["resourceVersion"] == fresh["metadata"]["resourceVersion"]
    assert outcome.problem == problem
    assert llmd(kube, ns, "cpu-demo")["status"] == fresh["status"]
    # Reconciling from the stale body likewise ends on the current owner, whose status already
    # reports the problem: no second Event is due.
    before, outcome = write_outcome(reconciler.kube, stale, reconciler.reconcile)
    assert outcome.problem == reported_problem(before) == problem
    assert llmd(kube, ns, "cpu-demo")["status"] == fresh["status"]
    assert len(events_for(plane, ns, "cpu-demo")) == 1


def test_no_finalizer_so_deletion_needs_no_operator(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    ns = namespace(plane, "no-finalizer")
    body = load_sample("cpu-demo.yaml")
    apply_yaml(plane, ns, body)
    wait_for(lambda: children(kube, ns, "cpu-demo")["PodDisruptionBudget"], "the children")
    upgraded = load_sample("cpu-demo.yaml")
    upgraded["metadata"].update(name="upgraded", finalizers=[KOPF_FINALIZER])
    apply_yaml(plane, ns, upgraded)  # as an older operator with a resync timer left it
    wait_for(
        lambda: not llmd(kube, ns, "upgraded")["metadata"].get("finalizers"),
        "kopf to remove the finalizer an older version added",
    )
    assert "finalizers" not in llmd(kube, ns, "cpu-demo")["metadata"]

    operator.stop()
    try:
        plane.kubectl("delete", "llmd", "cpu-demo", "upgraded", "-n", ns, "--wait=false")
        wait_for(lambda: llmd(kube, ns, "cpu-demo") is None, "the LLMDeployment gone", 20)
        wait_for(lambda: llmd(kube, ns, "upgraded") is None, "the upgraded one gone", 20)
        plane.kubectl("delete", "namespace", ns, "--wait=false")
        wait_for(
            lambda: plane.kubectl("get", "namespace", ns, check=False).returncode != 0,
            "the namespace gone without the operator",
            90,
        )
    finally:
        operator.start()


QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "no-services"},
    "spec": {"hard": {"services": "0"}},
}


def test_deleted_child_is_recreated_after_a_transient_error(
    plane: ControlPlane, operator: Operator, kube: Kube
) -> None:
    """The resync is an hour away: only the backoff retry can bring the Service back."""
    ns = namespace(plane, "transient")
    apply_yaml(plane, ns, load_sample("cpu-demo.yaml"))
    before = wait_for(lambda: children(kube, ns, "cpu-demo")["Service"], "the Service")
    apply_yaml(plane, ns, QUOTA)
    wait_for(
        lambda: (
            client.CoreV1Api(plane.admin_client())
            .read_namespaced_resource_quota("no-services", ns)
            .status.hard
        ),
        "the quota computed",
    )
    logged = len(operator.text())
    plane.kubectl("delete", "service", "cpu-demo", "-n", ns)
    wait_for(
        lambda: (
            f'[{ns}/cpu-demo] child event not handled, retry in 1s: services "cpu-demo" is '
            "forbidden: exceeded quota: no-services" in operator.text()[logged:]
        ),
        "the refused re-creation, logged with the API server's message",
    )
    plane.kubectl("delete", "resourcequota", "no-services", "-n", ns)
    again = wait_for(lambda: children(kube, ns, "cpu-demo")["Service"], "the Service again", 40)
    assert again["metadata"]["uid"] != before["metadata"]["uid"]
    assert again["spec"]["selector"] == before["spec"]["selector"]


HOLD = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "hold", "finalizers": ["kvserve.io/test-hold"]},
}


def test_namespace_deletion_logs_the_cause(
    plane: ControlPlane,
    operator: Operator,
    kube: Kube,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ns = namespace(plane, "doomed")
    for name in ("a", "b", "c"):
        body = load_sample("cpu-demo.yaml")
        body["metadata"]["name"] = name
        apply_yaml(plane, ns, body)
    for name in ("a", "b", "c"):
        wait_for(lambda n=name: children(kube, ns, n)["PodDisruptionBudget"], f"{name}'s children")
    apply_yaml(plane, ns, HOLD)  # keeps the namespace Terminating until the test lets it go
    saved = llmd(kube, ns, "a")
    logged = len(operator.text())
    plane.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for(
        lambda: (
            all(llmd(kube, ns, n) is None for n in ("a", "b", "c"))
            and children(kube, ns, "a")["Deployment"] is None
        ),
        "the namespace's content deleted",
        60,
    )

    # A reconcile that comes late (a child deleted before its owner) is refused with a 403 whose
    # message names the cause; it is logged as such and not retried.
    caplog.set_level(logging.INFO, logger="test")
    memo = SimpleNamespace(reconciler=_as_operator(operator, monkeypatch))
    handlers.reconcile(body=saved, memo=memo, retry=0, logger=logging.getLogger("test"))
    assert [r.getMessage() for r in caplog.records if r.name == "test"] == [
        'not reconciled: deployments.apps "a" is forbidden: unable to create new content in '
        "namespace doomed because it is being terminated"
    ]

    plane.kubectl("patch", "configmap", "hold", "-n", ns, "--type=merge", "-p",
                  '{"metadata": {"finalizers": null}}')  # fmt: skip
    wait_for(
        lambda: plane.kubectl("get", "namespace", ns, check=False).returncode != 0,
        "the namespace gone",
        90,
    )
    log = operator.text()[logged:]
    assert "403 Forbidden" not in log and "Traceback" not in log, log
    refusals = [line for line in log.splitlines() if "being terminated" in line]
    assert all("[INFO    ]" in line for line in refusals), refusals
