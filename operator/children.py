"""Which children an LLMDeployment has, rendered in full, and which it must no longer have.

The workload is a Deployment, or a LeaderWorkerSet when one replica spans several pods
(``leader_worker_set``); then the Service, the InferencePool and the HPA follow the groups'
leaders. Where the cluster serves no LeaderWorkerSet API, such a spec gets no workload and no
HPA, and the ``LeaderWorkerSet`` condition says why; its Service already selects leaders only,
so a Deployment of an earlier spec, which nothing replaces and which is left in place, is no
longer behind it.
"""

from typing import Any

from kvserve.operator.autoscaler import render_hpa
from kvserve.operator.deployment import render_deployment
from kvserve.operator.discovery import LEADER_WORKER_SET_VERSION, ClusterApis
from kvserve.operator.disruption_budget import render_pdb
from kvserve.operator.inference_pool import pool_name, render_inference_pool
from kvserve.operator.leader_worker_set import (
    LWS_KIND,
    leader_selector,
    render_leader_worker_set,
)
from kvserve.operator.model_rewrite import render_model_rewrite
from kvserve.operator.pod_monitor import render_pod_monitor
from kvserve.operator.service import render_service
from kvserve.operator.spec import LLMDeploymentSpec, ModelSource, pods_per_replica


def desired_replicas(spec: LLMDeploymentSpec, current: int | None) -> int:
    """``spec.replicas``; under autoscaling, the autoscaler's current count kept within bounds.

    Under autoscaling the operator re-states the count it reads (a new Deployment starts at
    ``minReplicas``) instead of leaving the field out: a field that server-side apply stops
    stating is reset, which would drop a scaled-up Deployment to one pod.
    """
    scaling = spec.autoscaling
    if scaling is None:
        return spec.replicas
    start = scaling.min_replicas if current is None else current
    return min(max(start, scaling.min_replicas), scaling.max_replicas)


def grouped(spec: LLMDeploymentSpec) -> bool:
    """Whether a replica spans several pods: a LeaderWorkerSet's group."""
    return pods_per_replica(spec) > 1


def _owns_hpa(spec: LLMDeploymentSpec) -> bool:
    return spec.autoscaling is not None and spec.autoscaling.controller == "HPA"


def desired_children(
    owner: dict[str, Any],
    spec: LLMDeploymentSpec,
    source: ModelSource,
    apis: ClusterApis,
    image: str,
    current_replicas: int | None,
) -> list[dict[str, Any]]:
    """Every child, the workload first (the others refer to its pods)."""
    replicas = desired_replicas(spec, current_replicas)
    selector = leader_selector(owner["metadata"]["name"]) if grouped(spec) else None
    if not grouped(spec):
        workload = [render_deployment(owner, spec, source, image, replicas)]
    elif apis.leader_worker_set:
        workload = [render_leader_worker_set(owner, spec, source, image, replicas)]
    else:
        workload = []
    children = [
        *workload,
        render_service(owner, selector),
        render_pdb(owner, apis.pdb_version),
    ]
    if workload and spec.autoscaling is not None and spec.autoscaling.controller == "HPA":
        target = (workload[0]["apiVersion"], workload[0]["kind"])
        children.append(render_hpa(owner, spec.autoscaling, apis.hpa_version, target))
    if apis.pod_monitor:
        children.append(render_pod_monitor(owner))
    pool = spec.gateway.inference_pool
    if pool is not None and apis.inference_pool:
        children.append(render_inference_pool(owner, pool, selector))
        if spec.adapters and apis.model_rewrite_version is not None:
            name = pool_name(owner, pool)
            version = apis.model_rewrite_version
            children.append(render_model_rewrite(owner, name, spec.adapters, version))
    return children


def obsolete_children(spec: LLMDeploymentSpec, apis: ClusterApis) -> list[tuple[str, str]]:
    """(apiVersion, kind) of children a previous spec may have created and this one does not:
    the Deployment once a LeaderWorkerSet replaces it, and the other way round."""
    obsolete = [] if _owns_hpa(spec) else [(apis.hpa_version, "HorizontalPodAutoscaler")]
    if apis.leader_worker_set:
        other = (
            ("apps/v1", "Deployment") if grouped(spec) else (LEADER_WORKER_SET_VERSION, LWS_KIND)
        )
        obsolete.append(other)
    return obsolete
