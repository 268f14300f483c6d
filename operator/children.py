"""Which children an LLMDeployment has, rendered in full, and which it must no longer have."""

from typing import Any

from kvserve.operator.autoscaler import render_hpa
from kvserve.operator.deployment import render_deployment
from kvserve.operator.discovery import ClusterApis
from kvserve.operator.disruption_budget import render_pdb
from kvserve.operator.inference_pool import pool_name, render_inference_pool
from kvserve.operator.model_rewrite import render_model_rewrite
from kvserve.operator.pod_monitor import render_pod_monitor
from kvserve.operator.service import render_service
from kvserve.operator.spec import LLMDeploymentSpec, ModelSource


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
    """Every child, Deployment first (the others refer to its pods)."""
    replicas = desired_replicas(spec, current_replicas)
    children = [
        render_deployment(owner, spec, source, image, replicas),
        render_service(owner),
        render_pdb(owner, apis.pdb_version),
    ]
    if spec.autoscaling is not None and spec.autoscaling.controller == "HPA":
        children.append(render_hpa(owner, spec.autoscaling, apis.hpa_version))
    if apis.pod_monitor:
        children.append(render_pod_monitor(owner))
    pool = spec.gateway.inference_pool
    if pool is not None and apis.inference_pool:
        children.append(render_inference_pool(owner, pool))
        if spec.adapters and apis.model_rewrite_version is not None:
            name = pool_name(owner, pool)
            version = apis.model_rewrite_version
            children.append(render_model_rewrite(owner, name, spec.adapters, version))
    return children


def obsolete_children(spec: LLMDeploymentSpec, apis: ClusterApis) -> list[tuple[str, str]]:
    """(apiVersion, kind) of children a previous spec may have created and this one does not."""
    return [] if _owns_hpa(spec) else [(apis.hpa_version, "HorizontalPodAutoscaler")]
