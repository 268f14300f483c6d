"""One level-based reconciliation of an LLMDeployment: read, render, apply, report.

``reconcile`` looks only at the resource and the cluster as they are now, never at what changed,
so it converges from any starting point: a first create, an operator restart, a child deleted
by hand. Running it twice in a row changes nothing the second time.
"""

import os
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from kubernetes.client.rest import ApiException

from kvserve.operator.adapter_status import CONDITION as ADAPTERS_CONDITION
from kvserve.operator.adapter_status import adapter_report
from kvserve.operator.adapter_sync import PodSync, pod_address, sync_pod
from kvserve.operator.adapters import ADAPTERS_GATE, adapters
from kvserve.operator.children import desired_children, grouped, obsolete_children
from kvserve.operator.discovery import (
    INFERENCE_POOL_VERSION,
    LEADER_WORKER_SET_VERSION,
    ClusterApis,
    discover,
)
from kvserve.operator.inference_pool import CONDITION as POOL_CONDITION
from kvserve.operator.inference_pool import pool_condition, pool_name, stale_pools
from kvserve.operator.kube import Kube, api_message
from kvserve.operator.leader_worker_set import CONDITION as GROUP_CONDITION
from kvserve.operator.leader_worker_set import LWS_KIND, lws_condition
from kvserve.operator.metrics_source import CONDITION, MetricsSource
from kvserve.operator.model_rewrite import CONDITION as ROUTES_CONDITION
from kvserve.operator.model_rewrite import adapter_routes
from kvserve.operator.names import name_problem
from kvserve.operator.resource import selector_string
from kvserve.operator.spec import (
    InferencePoolSpec,
    InvalidSpec,
    LLMDeploymentSpec,
    pods_per_replica,
)
from kvserve.operator.status import build_status, reported_problem, with_condition
from kvserve.operator.validation import validated

IMAGE_ENV = "KVSERVE_SERVING_IMAGE"
"""The serving image when a spec names none (the chart sets it to its own image)."""


def default_image() -> str:
    return os.environ.get(IMAGE_ENV) or f"kvserve:{version('kvserve')}"


@dataclass(frozen=True)
class Outcome:
    status: dict[str, Any]
    problem: tuple[str, str] | None
    """(reason, message) of the ``Degraded`` condition when the spec cannot be reconciled."""


class Reconciler:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.metrics = MetricsSource(kube.api)

    def _status(
        self,
        owner: dict[str, Any],
        deployment: dict[str, Any] | None,
        problem: tuple[str, str] | None = None,
        pool: tuple[InferencePoolSpec, bool] | None = None,
        spec: LLMDeploymentSpec | None = None,
        apis: ClusterApis | None = None,
        routes: tuple[bool, str, str] | None = None,
    ) -> dict[str, Any]:
        """``build_status`` from the workload (the Deployment, or the LeaderWorkerSet, whose
        status counts groups: ready when the leader and every worker are) and the pods; with
        the ``InferencePool`` condition when ``pool`` (the spec's pool, whether the cluster
        serves its API) is given, the ``LeaderWorkerSet`` condition when the valid ``spec``
        asks for groups (``apis`` says whether the cluster serves that API), the ``AdapterRoutes``
        one when ``routes`` is (``adapter_routes``),
        ``adapters`` and the ``AdaptersReady`` condition when the valid ``spec`` has adapters
        (each Ready pod is synced to them first: ``adapter_sync``; a valid spec without any
        clears ``adapters``), and the ``CustomMetrics``
        condition when an HPA scales ``owner``.

        The pods are listed by the selector of ``owner``'s name only if that name passes
        ``name_problem``: one that fails it has no pods (nothing was applied), and one longer
        than 63 characters makes a selector the API server refuses (400, "invalid label
        value"), which would fail each reconcile before it writes the ``Degraded`` condition."""
        meta = owner["metadata"]
        pods = []
        if name_problem(meta["name"]) is None:
            selector = selector_string(meta["name"])
            pods = self.kube.list_labelled("v1", "Pod", meta["namespace"], selector)
        status = build_status(owner, deployment, problem, pods)
        if pool is not None:
            status = with_condition(status, owner, POOL_CONDITION, *pool_condition(owner, *pool))
        if spec is not None and apis is not None and grouped(spec):
            groups = lws_condition(apis.leader_worker_set, pods_per_replica(spec))
            status = with_condition(status, owner, GROUP_CONDITION, *groups)
        if routes is not None:
            status = with_condition(status, owner, ROUTES_CONDITION, *routes)
        if spec is not None and not spec.adapters and "adapters" in (owner.get("status") or {}):
            status = {**status, "adapters": None}  # a merge patch deletes a key set to null
        if spec is not None and spec.adapters:
            entries, served = adapter_report(spec.adapters, self._sync_adapters(owner, spec, pods))
            status = with_condition(
                {**status, "adapters": entries}, owner, ADAPTERS_CONDITION, *served
            )
        scaling = owner["spec"].get("autoscaling")
        if not isinstance(scaling, dict) or scaling.get("controller", "HPA") != "HPA":
            return status
        verdict = self.metrics.verdict()
        return status if verdict is None else with_condition(status, owner, CONDITION, *verdict)

    def _sync_adapters(
        self, owner: dict[str, Any], spec: LLMDeploymentSpec, pods: list[dict[str, Any]]
    ) -> dict[str, PodSync]:
        """Each pod whose server is ready brought to the spec's adapters, by pod name, with
        the API key of ``apiKeySecret`` if set (read each time: a rotated key is picked up);
        the first sync a pod answers opens its readiness gate (``adapters.ADAPTERS_GATE``)."""
        base = spec.model.served_name or owner["metadata"]["name"]
        wanted = {a.name: a.path for a in adapters(spec)}
        ready = [(pod, address) for pod in pods if (address := pod_address(pod)) is not None]
        secret, namespace = spec.api_key_secret, owner["metadata"]["namespace"]
        key = None
        if secret is not None and ready:
            key = self.kube.secret_value(namespace, secret.name, secret.key)
        synced = {}
        for pod, address in ready:
            meta = pod["metadata"]
            synced[meta["name"]] = result = sync_pod(address, base, wanted, key)
            conditions = (pod.get("status") or {}).get("conditions") or []
            gate: dict[str, Any] = next(
                (c for c in conditions if c.get("type") == ADAPTERS_GATE), {}
            )
            if result.answered and gate.get("status") != "True":
                self.kube.set_pod_condition(meta["namespace"], meta["name"], ADAPTERS_GATE)
        return synced

    def _remove_stale(
        self, owner: dict[str, Any], api_version: str, kind: str, keep: str | None
    ) -> None:
        """Delete ``owner``'s children of ``kind`` (InferencePool, InferenceModelRewrite:
        named by the user) but ``keep``."""
        meta = owner["metadata"]
        ns, selector = meta["namespace"], selector_string(meta["name"])
        listed = self.kube.list_labelled(api_version, kind, ns, selector)
        for name in stale_pools(listed, owner, keep):
            self.kube.delete(api_version, kind, ns, name)

    def _workload(
        self, owner: dict[str, Any], spec: LLMDeploymentSpec | None
    ) -> dict[str, Any] | None:
        """The Deployment, or for a spec of groups the LeaderWorkerSet; for an invalid spec
        (None) whichever of the two exists, the Deployment first."""
        meta = owner["metadata"]
        kinds = [("apps/v1", "Deployment"), (LEADER_WORKER_SET_VERSION, LWS_KIND)]
        if spec is not None:
            kinds = kinds[1:] if grouped(spec) else kinds[:1]
        for api_version, kind in kinds:
            found = self.kube.get(api_version, kind, meta["namespace"], meta["name"])
            if found is not None:
                return found
        return None

    def reconcile(self, owner: dict[str, Any]) -> Outcome:
        """Apply every child the spec asks for, delete the obsolete ones, compute the status.

        A spec that fails validation (``validation.validated``: nothing is applied), or one the
        API server rejects (400/422), leaves the children of the last valid spec running and is
        reported as ``Degraded``. Other API errors propagate, for the caller to retry.
        """
        meta = owner["metadata"]
        try:
            spec, source = validated(owner)
        except InvalidSpec as e:
            problem = (e.reason, str(e))
            return Outcome(self._status(owner, self._workload(owner, None), problem), problem)
        apis = discover(self.kube.api)
        current = self._workload(owner, spec)
        replicas = current["spec"].get("replicas") if current else None
        image = spec.image or default_image()
        deployment = current
        try:
            for child in desired_children(owner, spec, source, apis, image, replicas):
                applied = self.kube.apply(child)
                if child["kind"] in ("Deployment", LWS_KIND):
                    deployment = applied
        except ApiException as e:
            if e.status not in (400, 422):
                raise
            problem = ("ApplyFailed", f"the API server rejected a child: {api_message(e)}")
            return Outcome(self._status(owner, deployment, problem), problem)
        for api_version, kind in obsolete_children(spec, apis):
            self.kube.delete(api_version, kind, meta["namespace"], meta["name"])
        wanted = spec.gateway.inference_pool
        keep = None if wanted is None else pool_name(owner, wanted)
        if apis.inference_pool:
            self._remove_stale(owner, INFERENCE_POOL_VERSION, "InferencePool", keep)
        if apis.model_rewrite_version is not None:
            rewritten = keep if apis.inference_pool and spec.adapters else None
            kind = "InferenceModelRewrite"
            self._remove_stale(owner, apis.model_rewrite_version, kind, rewritten)
        pool = None if wanted is None else (wanted, apis.inference_pool)
        routes = adapter_routes(owner, spec, apis)
        status = self._status(owner, deployment, pool=pool, spec=spec, apis=apis, routes=routes)
        return Outcome(status, None)

    def status(self, owner: dict[str, Any]) -> Outcome:
        """The status from the workload as it is now, without applying anything."""
        problem, pool, spec, apis, routes = None, None, None, None, None
        try:
            spec, _ = validated(owner)
        except InvalidSpec as e:
            problem = (e.reason, str(e))
        else:
            wanted = spec.gateway.inference_pool
            if wanted is not None or grouped(spec):
                apis = discover(self.kube.api)
            if wanted is not None and apis is not None:
                pool, routes = (wanted, apis.inference_pool), adapter_routes(owner, spec, apis)
        observed = (owner.get("status") or {}).get("observedGeneration")
        if problem is None and observed == owner["metadata"].get("generation"):
            problem = reported_problem(owner)  # e.g. ApplyFailed: holds until the spec changes
        workload = self._workload(owner, spec)
        status = self._status(owner, workload, problem, pool, spec, apis, routes)
        return Outcome(status, problem)
