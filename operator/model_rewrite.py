"""The InferenceModelRewrite that routes an LLMDeployment's adapters by name through its
InferencePool (where that API exists, the spec asks for a pool and has adapters).

Through a gateway, a request names the adapter as its model: the pool's endpoint picker reads
that name (for its LoRA affinity, from each pod's ``vllm:lora_requests_info``) and passes the
body on to a pod, which serves the adapter under it. The rewrite states each adapter's name as
a model of the pool: one rule per adapter, in the spec's order, matching the name exactly and
keeping it. Exact matches take precedence over generic ones (a rule with no match), so a
catch-all rewrite that someone adds on the same pool (a canary of the base model, say) never
sends an adapter's requests to another model. One object per LLMDeployment, named after its
pool.

The API moved from the Gateway API Inference Extension (``inference.networking.x-k8s.io``,
v1.2 to v1.5) to the llm-d router (``llm-d.ai``), one schema under both groups: the operator
renders the version discovery finds (``discovery.MODEL_REWRITE_VERSIONS``, newest first).
"""

from typing import Any

from kvserve.operator.discovery import INFERENCE_POOL_VERSION, MODEL_REWRITE_VERSIONS, ClusterApis
from kvserve.operator.inference_pool import pool_name as pool_name_of
from kvserve.operator.resource import child_metadata
from kvserve.operator.spec import AdapterSpec, LLMDeploymentSpec

CONDITION = "AdapterRoutes"
MISSING_API = "InferenceModelRewriteAPIMissing"


def render_model_rewrite(
    owner: dict[str, Any], pool_name: str, adapters: list[AdapterSpec], api_version: str
) -> dict[str, Any]:
    rules = [
        {
            "matches": [{"model": {"type": "Exact", "value": adapter.name}}],
            "targets": [{"modelRewrite": adapter.name}],
        }
        for adapter in adapters
    ]
    pool_ref = {
        "group": INFERENCE_POOL_VERSION.split("/")[0],
        "kind": "InferencePool",
        "name": pool_name,
    }
    return {
        "apiVersion": api_version,
        "kind": "InferenceModelRewrite",
        "metadata": child_metadata(owner, pool_name),
        "spec": {"poolRef": pool_ref, "rules": rules},
    }


def rewrite_condition(
    pool_name: str, adapters: list[AdapterSpec], api_version: str | None
) -> tuple[bool, str, str]:
    """(ok, reason, message) of the ``AdapterRoutes`` condition, for a spec with adapters that
    asks for a pool the cluster serves."""
    names = ", ".join(a.name for a in adapters)
    if api_version is None:
        versions = " or ".join(MODEL_REWRITE_VERSIONS)
        return (
            False,
            MISSING_API,
            f"the cluster serves no InferenceModelRewrite API ({versions}): adapters "
            f"{names} pass through InferencePool {pool_name} undeclared, where a catch-all "
            "rewrite would take their requests; install the endpoint picker's CRDs (the "
            "rewrite is made at the next reconcile after that)",
        )
    return (
        True,
        "RewriteApplied",
        f"InferenceModelRewrite {pool_name} routes adapters {names} through InferencePool "
        f"{pool_name} by name",
    )


def adapter_routes(
    owner: dict[str, Any], spec: LLMDeploymentSpec, apis: ClusterApis
) -> tuple[bool, str, str] | None:
    """The ``AdapterRoutes`` condition of a spec with adapters and a pool the cluster serves,
    else None (no adapters, no pool, or no pool API: the ``InferencePool`` condition says so)."""
    wanted = spec.gateway.inference_pool
    if wanted is None or not apis.inference_pool or not spec.adapters:
        return None
    name = pool_name_of(owner, wanted)
    return rewrite_condition(name, spec.adapters, apis.model_rewrite_version)
