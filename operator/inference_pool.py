"""The Gateway API Inference Extension's InferencePool for an LLMDeployment's pods (where that
API exists and the spec asks for one).

The pool selects the pods by ``selector_labels`` (``app.kubernetes.io/name: kvserve`` and
``kvserve.io/llmdeployment: NAME``, the Service's selector) on ``HTTP_PORT``, where each pod
serves the OpenAI API and the metrics an endpoint picker reads. A gateway routes only to the
Ready pods among them.
"""

from typing import Any

from kvserve.operator.discovery import INFERENCE_POOL_VERSION
from kvserve.operator.resource import HTTP_PORT, child_metadata, selector_labels
from kvserve.operator.spec import InferencePoolSpec

CONDITION = "InferencePool"
MISSING_API = "InferencePoolAPIMissing"


def pool_name(owner: dict[str, Any], pool: InferencePoolSpec) -> str:
    return pool.name or owner["metadata"]["name"]


def render_inference_pool(
    owner: dict[str, Any], pool: InferencePoolSpec, selector: dict[str, str] | None = None
) -> dict[str, Any]:
    """``selector``: the pods that serve (default: all of the LLMDeployment's; a group's
    leaders when a replica spans several pods)."""
    labels = selector or selector_labels(owner["metadata"]["name"])
    spec: dict[str, Any] = {
        "selector": {"matchLabels": labels},
        "targetPorts": [{"number": HTTP_PORT}],
    }
    picker = pool.endpoint_picker_ref
    if picker is not None:
        spec["endpointPickerRef"] = {
            "name": picker.name,
            "port": {"number": picker.port},
            "failureMode": picker.failure_mode,
        }
    return {
        "apiVersion": INFERENCE_POOL_VERSION,
        "kind": "InferencePool",
        "metadata": child_metadata(owner, pool_name(owner, pool)),
        "spec": spec,
    }


def stale_pools(pools: list[dict[str, Any]], owner: dict[str, Any], keep: str | None) -> list[str]:
    """Names of the listed pools that ``owner`` controls but for ``keep`` (the one it wants):
    a pool renamed or no longer asked for."""
    uid = owner["metadata"]["uid"]
    return [
        p["metadata"]["name"]
        for p in pools
        if p["metadata"]["name"] != keep
        and any(
            r.get("uid") == uid and r.get("controller")
            for r in p["metadata"].get("ownerReferences") or []
        )
    ]


def pool_condition(
    owner: dict[str, Any], pool: InferencePoolSpec, api_served: bool
) -> tuple[bool, str, str]:
    """(ok, reason, message) of the ``InferencePool`` condition, for a spec that asks for one."""
    name = pool_name(owner, pool)
    if not api_served:
        return (
            False,
            MISSING_API,
            f"the spec asks for InferencePool {name}, but the cluster serves no "
            f"{INFERENCE_POOL_VERSION} InferencePool API: install the Gateway API Inference "
            "Extension's CRDs (the pool is made at the next reconcile after that)",
        )
    return (True, "PoolApplied", f"InferencePool {name} selects the pods on port {HTTP_PORT}")
