"""An LLMDeployment's status, derived from its Deployment's status and the last reconcile.

Conditions follow the Kubernetes convention (type, status, reason, message,
lastTransitionTime); a condition's time changes only when its status flips, so recomputing an
unchanged status yields the same object and patching it changes nothing.

- ``Available``: at least one pod is ready to serve.
- ``Progressing``: a rollout or scaling is under way (not every desired pod is updated and ready).
- ``Degraded``: the spec cannot be reconciled (reason ``InvalidSpec``) or applying it failed.
- ``ModelLoaded``: whether the pods loaded the model (``model_load``); ``modelLoadSeconds``
  keeps the last load time measured.

``phase`` condenses them: ``Degraded``, else ``Progressing`` while not every desired pod is
updated and ready, else ``ScaledToZero`` when none is wanted (nothing serves, by choice: a
phase of its own, so that ``kubectl get`` does not read as serving), else ``Ready``.
``endpoint`` is left out for a name that cannot name a Service: there is none to advertise.
"""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kvserve.operator.model_load import CONDITION as LOAD_CONDITION
from kvserve.operator.model_load import model_load
from kvserve.operator.names import is_service_name
from kvserve.operator.resource import selector_string
from kvserve.operator.service import endpoint


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, ok: bool | None, reason: str, message: str, previous: list[dict]) -> dict:
    status = "Unknown" if ok is None else "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == kind), None)
    since = before["lastTransitionTime"] if before and before.get("status") == status else _now()
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }


def reported_problem(owner: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of the ``Degraded`` condition the status shows, if that is True."""
    for c in (owner.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Degraded" and c.get("status") == "True":
            return c.get("reason"), c.get("message")
    return None


def build_status(
    owner: dict[str, Any],
    deployment: dict[str, Any] | None,
    degraded: tuple[str, str] | None = None,
    pods: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The full status; ``degraded`` is (reason, message) when reconciliation failed, ``pods``
    the LLMDeployment's pods (for ``ModelLoaded``)."""
    meta = owner["metadata"]
    before = owner.get("status") or {}
    previous = before.get("conditions") or []
    dep_spec = (deployment or {}).get("spec") or {}
    dep_status = (deployment or {}).get("status") or {}
    desired = dep_spec.get("replicas", 0) if deployment else 0
    replicas = dep_status.get("replicas", 0)
    ready = dep_status.get("readyReplicas", 0)
    updated = dep_status.get("updatedReplicas", 0)
    current = deployment is not None and dep_status.get("observedGeneration", 0) >= deployment[
        "metadata"
    ].get("generation", 0)
    settled = current and replicas == desired and updated == desired and ready == desired

    if deployment is None:
        available = _condition("Available", False, "NoDeployment", "no Deployment yet", previous)
    elif ready:
        msg = f"{ready}/{desired} replicas ready"
        available = _condition("Available", True, "MinimumReplicasAvailable", msg, previous)
    elif desired == 0:
        available = _condition("Available", False, "ScaledToZero", "0 replicas wanted", previous)
    else:
        msg = f"0/{desired} replicas ready"
        available = _condition("Available", False, "NoReplicasReady", msg, previous)
    if settled:
        msg = f"{desired} replicas updated and ready"
        progressing = _condition("Progressing", False, "RolloutComplete", msg, previous)
    else:
        msg = f"{updated}/{desired} replicas updated, {ready} ready, {replicas} in total"
        progressing = _condition("Progressing", True, "RollingOut", msg, previous)
    if degraded is not None:
        degraded_condition = _condition("Degraded", True, degraded[0], degraded[1], previous)
    else:
        msg = "the spec is reconciled"
        degraded_condition = _condition("Degraded", False, "Reconciled", msg, previous)
    load = model_load(list(pods))
    loaded = _condition(LOAD_CONDITION, load.loaded, load.reason, load.message, previous)

    if degraded is not None:
        phase = "Degraded"
    elif not settled:
        phase = "Progressing"
    elif desired == 0:
        phase = "ScaledToZero"
    else:
        phase = "Ready"
    status = {
        "phase": phase,
        "replicas": replicas,
        "readyReplicas": ready,
        "selector": selector_string(meta["name"]),
        "endpoint": endpoint(meta["name"], meta["namespace"]),
        "conditions": [available, progressing, degraded_condition, loaded],
        "observedGeneration": meta.get("generation", 0),
    }
    seconds = load.seconds if load.seconds is not None else before.get("modelLoadSeconds")
    if seconds is not None:
        status["modelLoadSeconds"] = seconds
    if not is_service_name(meta["name"]):
        del status["endpoint"]
    return status


def with_condition(
    status: dict[str, Any],
    owner: dict[str, Any],
    kind: str,
    ok: bool | None,
    reason: str,
    message: str,
) -> dict[str, Any]:
    """``status`` with one more condition, its time kept from the owner's while its status holds."""
    previous = (owner.get("status") or {}).get("conditions") or []
    condition = _condition(kind, ok, reason, message, previous)
    return {**status, "conditions": [*status["conditions"], condition]}


def new_warning(before: dict[str, Any], status: dict[str, Any], kind: str) -> dict | None:
    """The condition ``kind`` of ``status`` if it is False and ``before``'s status did not show
    it False for the same reason: a problem to post once as an Event."""
    now = next((c for c in status["conditions"] if c["type"] == kind), None)
    if now is None or now["status"] != "False":
        return None
    shown = ((before.get("status") or {}).get("conditions")) or []
    seen = any(
        c.get("type") == kind and c.get("status") == "False" and c.get("reason") == now["reason"]
        for c in shown
    )
    return None if seen else now
