"""The kopf operator: ``kopf run --standalone -A -m kvserve.operator.handlers``.

Every trigger funnels into the same level-based ``Reconciler.reconcile``:
- the LLMDeployment is created, its spec changes, or the operator (re)starts (resume);
- a child is deleted (by hand, or by anything but the garbage collector): it is re-created;
- a periodic resync (``KVSERVE_RESYNC_SECONDS``, default 300) repairs any other drift.
A child Deployment's status change only refreshes the owner's status.

An invalid spec becomes a ``Degraded`` condition, and a Warning Event when that problem first
appears (not again on resyncs or restarts); the handler succeeds, so kopf does not retry what
only an edit can fix. Transient API
errors raise ``kopf.TemporaryError`` and are retried after ``RETRY_DELAY`` seconds. Handler
progress lives in annotations, so the status holds only what the CRD's schema declares.
"""

import logging
import os
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kvserve.operator.kube import Kube
from kvserve.operator.reconciler import Reconciler
from kvserve.operator.resource import API_VERSION, GROUP, KIND, MANAGED_BY, PLURAL, VERSION
from kvserve.operator.status import reported_problem

RETRY_DELAY = 10
RESYNC_SECONDS = float(os.environ.get("KVSERVE_RESYNC_SECONDS", "300"))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Least privilege: no watch on CRDs or namespaces; the kinds present at start are served.
    settings.scanning.disabled = True
    config.load_config()
    memo.reconciler = Reconciler(Kube(client.ApiClient()))


def _write_status(kube: Kube, owner: dict[str, Any], status: dict[str, Any]) -> None:
    if owner.get("status") == status:
        return
    meta = owner["metadata"]
    kube.patch_status(API_VERSION, KIND, meta["namespace"], meta["name"], status)


def _reconcile(reconciler: Reconciler, owner: dict[str, Any]) -> None:
    try:
        outcome = reconciler.reconcile(owner)
        _write_status(reconciler.kube, owner, outcome.status)
    except ApiException as e:
        raise kopf.TemporaryError(f"API error {e.status}: {e.reason}", delay=RETRY_DELAY) from e
    if outcome.problem is not None and outcome.problem != reported_problem(owner):
        reason, message = outcome.problem
        kopf.warn(owner, reason=reason, message=message)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile(memo.reconciler, dict(body))


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconcile(memo.reconciler, dict(body))


def _owner(reconciler: Reconciler, child: kopf.Body) -> dict[str, Any] | None:
    """The live LLMDeployment that controls ``child``; None if it is gone or going."""
    refs = child.metadata.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("kind") == KIND and r.get("controller")), None)
    if ref is None or ref.get("apiVersion") != API_VERSION:
        return None
    namespace = child.metadata["namespace"]
    owner = reconciler.kube.get(API_VERSION, KIND, namespace, ref["name"])
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return None
    return owner if owner["metadata"]["uid"] == ref["uid"] else None


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED_BY)
@kopf.on.event("", "v1", "services", labels=MANAGED_BY)
@kopf.on.event("autoscaling", "horizontalpodautoscalers", labels=MANAGED_BY)
@kopf.on.event("policy", "poddisruptionbudgets", labels=MANAGED_BY)
@kopf.on.event("monitoring.coreos.com", "podmonitors", labels=MANAGED_BY)
def child_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconciler: Reconciler = memo.reconciler
    try:
        owner = _owner(reconciler, body)
        if owner is None:
            return
        if event["type"] == "DELETED":
            _reconcile(reconciler, owner)
        elif body.get("kind") == "Deployment":
            _write_status(reconciler.kube, owner, reconciler.status(owner))
    except ApiException as e:
        logging.getLogger(__name__).warning("child event not handled: %s %s", e.status, e.reason)
