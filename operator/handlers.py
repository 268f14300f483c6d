"""The kopf operator: ``kopf run --standalone -A -m kvserve.operator.handlers`` (a namespaced
install passes ``--namespace=NS`` for each watched namespace instead of ``-A``).

Every trigger funnels into the same level-based ``Reconciler.reconcile``:
- the LLMDeployment is created, its spec changes, or the operator (re)starts (resume);
- a child is deleted (by hand, or by anything but the garbage collector): it is re-created;
- a periodic resync (``KVSERVE_RESYNC_SECONDS``, default 300) repairs any other drift.
A child Deployment's or a pod's status change only refreshes the owner's status (the pods give
``ModelLoaded``). A spec asking for an InferencePool where the cluster serves no such API gets
a False ``InferencePool`` condition and one Warning Event, like an invalid spec; so does a spec
of multi-pod replicas where it serves no LeaderWorkerSet API (``LeaderWorkerSet``), one with
adapters where no InferenceModelRewrite API is served (``AdapterRoutes``), and pods
that fail to load the model (``ModelLoaded`` False: a failed download, a crashing server), one
Event per reason, not one per restart or status refresh.

An invalid spec becomes a ``Degraded`` condition, and a Warning Event when that problem first
appears (not again on resyncs or restarts); the handler succeeds, so kopf does not retry what
only an edit can fix. Transient API errors are retried with exponential backoff
(``retry_delay``): kopf's ``TemporaryError`` for the resource's own handlers, a bounded loop
for a deleted child. A namespace being deleted is not retried. The logs carry the API server's
message, which names the cause (a 403 says "... because it is being terminated").

No finalizer: the resync is an operator-level task over kopf's index (``resync``), and the
children go with their owner through ownerReferences. A finalizer that an older version added
is removed by kopf the next time it sees the object. Handler progress lives in annotations, so
the status holds only what the CRD's schema declares; status writes never go backwards
(``status_write``).
"""

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kvserve.operator.adapter_status import CONDITION as ADAPTERS_CONDITION
from kvserve.operator.inference_pool import CONDITION as POOL_CONDITION
from kvserve.operator.kube import Kube, api_message, namespace_terminating
from kvserve.operator.leader_worker_set import CONDITION as GROUP_CONDITION
from kvserve.operator.leader_worker_set import LWS_KIND
from kvserve.operator.model_load import CONDITION as LOAD_CONDITION
from kvserve.operator.model_rewrite import CONDITION as ROUTES_CONDITION
from kvserve.operator.reconciler import Outcome, Reconciler
from kvserve.operator.resource import (
    API_VERSION,
    GROUP,
    INSTANCE_LABEL,
    KIND,
    MANAGED_BY,
    PLURAL,
    VERSION,
)
from kvserve.operator.resync import resync_forever
from kvserve.operator.status import new_warning, reported_problem
from kvserve.operator.status_write import StatusConflict, write_outcome

RESYNC_SECONDS = float(os.environ.get("KVSERVE_RESYNC_SECONDS", "300"))
MAX_RETRY_DELAY = 60.0
CHILD_ATTEMPTS = 10
"""Attempts to handle one child event (about 4 minutes of backoff); the resync takes over."""


def retry_delay(attempt: int) -> float:
    """Seconds before retry ``attempt`` + 1: 1, 2, 4, ... at most ``MAX_RETRY_DELAY``."""
    return min(2.0**attempt, MAX_RETRY_DELAY)


_Index = kopf.Index[tuple[str, str], bool]
"""The ``llmdeployments`` index: the watched LLMDeployments by (namespace, name)."""


@dataclass
class _Resync:
    index: _Index
    task: asyncio.Task | None = None


@kopf.index(GROUP, VERSION, PLURAL)
async def llmdeployments(
    namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> dict[tuple[str, str], bool]:
    """The watched LLMDeployments by (namespace, name), for the resync.

    The first one indexed starts the resync task: started here, the task inherits the context
    kopf gives an object's handlers, which ``kopf.warn`` needs to post an Event (a task started
    by the startup handler has none).
    """
    assert namespace is not None, "LLMDeployment is a namespaced kind"
    resync: _Resync = memo.resync
    if resync.task is None:
        reconciler: Reconciler = memo.reconciler
        resync.task = asyncio.create_task(
            resync_forever(
                lambda ns, n: _reconcile_named(reconciler, ns, n), resync.index, RESYNC_SECONDS
            )
        )
    return {(namespace, name): True}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """kopf passes each index among its keywords, named after its handler (``llmdeployments``)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    # Least privilege: no watch on CRDs or namespaces; the kinds present at start are served.
    settings.scanning.disabled = True
    config.load_config()
    memo.reconciler = Reconciler(Kube(client.ApiClient()))
    index: _Index = kwargs["llmdeployments"]
    memo.resync = _Resync(index)


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    if memo.resync.task is not None:
        memo.resync.task.cancel()


def _warn(owner: dict[str, Any], reason: str, message: str) -> None:
    """A Warning Event about ``owner``."""
    # kopf takes any mapping as an object (``dicts.walk``); its hint names only its own Body.
    kopf.warn(owner, reason=reason, message=message)  # type: ignore[arg-type]


WARNED_CONDITIONS = (
    POOL_CONDITION,
    LOAD_CONDITION,
    ADAPTERS_CONDITION,
    GROUP_CONDITION,
    ROUTES_CONDITION,
)
"""Conditions whose turning False (or changing reason while False) posts one Warning Event."""


def _warn_new_problems(written: tuple[dict[str, Any], Outcome] | None) -> None:
    """One Warning Event for each of ``WARNED_CONDITIONS`` that the written status shows False
    and the status it replaced did not, for that reason (``new_warning``)."""
    if written is not None:
        before, outcome = written
        for kind in WARNED_CONDITIONS:
            problem = new_warning(before, outcome.status, kind)
            if problem is not None:
                _warn(before, reason=problem["reason"], message=problem["message"])


def _reconcile(reconciler: Reconciler, owner: dict[str, Any]) -> None:
    written = write_outcome(reconciler.kube, owner, reconciler.reconcile)
    if written is None:
        return
    before, outcome = written
    if outcome.problem is not None and outcome.problem != reported_problem(before):
        reason, message = outcome.problem
        _warn(before, reason=reason, message=message)
    _warn_new_problems(written)


def _reconcile_named(reconciler: Reconciler, namespace: str, name: str) -> None:
    owner = reconciler.kube.get(API_VERSION, KIND, namespace, name)
    if owner is not None and not owner["metadata"].get("deletionTimestamp"):
        _reconcile(reconciler, owner)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile(body: kopf.Body, memo: kopf.Memo, retry: int, logger: kopf.Logger, **_: Any) -> None:
    try:
        _reconcile(memo.reconciler, dict(body))
    except StatusConflict as e:
        # Other writers kept changing the owner: try again later, no traceback in the log.
        raise kopf.TemporaryError(str(e), delay=retry_delay(retry)) from e
    except ApiException as e:
        if namespace_terminating(e):
            logger.info("not reconciled: %s", api_message(e))
            return
        raise kopf.TemporaryError(api_message(e), delay=retry_delay(retry)) from e


def _owner(reconciler: Reconciler, child: kopf.Body) -> dict[str, Any] | None:
    """The live LLMDeployment that controls ``child`` (for a pod, that its label names); None if
    it is gone or going."""
    namespace = child.metadata["namespace"]
    if child.get("kind") == "Pod":
        name = (child.metadata.get("labels") or {}).get(INSTANCE_LABEL)
        owner = reconciler.kube.get(API_VERSION, KIND, namespace, name) if name else None
        return None if owner is None or owner["metadata"].get("deletionTimestamp") else owner
    refs = child.metadata.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("kind") == KIND and r.get("controller")), None)
    if ref is None or ref.get("apiVersion") != API_VERSION:
        return None
    owner = reconciler.kube.get(API_VERSION, KIND, namespace, ref["name"])
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return None
    return owner if owner["metadata"]["uid"] == ref["uid"] else None


def _handle_child(reconciler: Reconciler, child: kopf.Body, deleted: bool) -> None:
    owner = _owner(reconciler, child)
    if owner is None:
        return
    if deleted:
        _reconcile(reconciler, owner)
    else:
        _warn_new_problems(write_outcome(reconciler.kube, owner, reconciler.status))


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED_BY)
@kopf.on.event("", "v1", "services", labels=MANAGED_BY)
@kopf.on.event("autoscaling", "horizontalpodautoscalers", labels=MANAGED_BY)
@kopf.on.event("policy", "poddisruptionbudgets", labels=MANAGED_BY)
@kopf.on.event("monitoring.coreos.com", "podmonitors", labels=MANAGED_BY)
@kopf.on.event("inference.networking.k8s.io", "inferencepools", labels=MANAGED_BY)
@kopf.on.event("leaderworkerset.x-k8s.io", "leaderworkersets", labels=MANAGED_BY)
@kopf.on.event("", "v1", "pods", labels=MANAGED_BY)
async def child_changed(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """A deleted child is re-created; a change of a Deployment, a LeaderWorkerSet or a pod (any,
    deleted too: pods are the ReplicaSet's or the LeaderWorkerSet's) refreshes the owner's
    status.

    kopf never retries an event handler, so API errors are retried here, with backoff. A
    status write that keeps conflicting (StatusConflict) is left to the writers that won.
    """
    kind = body.get("kind")
    deleted = event["type"] == "DELETED" and kind != "Pod"
    if not deleted and kind not in ("Deployment", LWS_KIND, "Pod"):
        return
    for attempt in range(CHILD_ATTEMPTS):
        try:
            await asyncio.to_thread(_handle_child, memo.reconciler, body, deleted)
            return
        except StatusConflict as e:
            # Others wrote the status in between, each from its own read; the resync catches up.
            logger.info("child event: status left to the newer writers (%s)", e)
            return
        except ApiException as e:
            if namespace_terminating(e):
                logger.info("child event not handled: %s", api_message(e))
                return
            if attempt + 1 == CHILD_ATTEMPTS:
                logger.warning("child event not handled, left to the resync: %s", api_message(e))
                return
            delay = retry_delay(attempt)
            logger.warning("child event not handled, retry in %.0fs: %s", delay, api_message(e))
            await asyncio.sleep(delay)
