"""The ClusterIP Service in front of an LLMDeployment's pods: the OpenAI-compatible endpoint."""

from typing import Any

from kvserve.operator.resource import HTTP_PORT, child_metadata, selector_labels


def endpoint(name: str, namespace: str) -> str:
    """The in-cluster base URL clients give the OpenAI SDK."""
    return f"http://{name}.{namespace}.svc:{HTTP_PORT}/v1"


def render_service(owner: dict[str, Any], selector: dict[str, str] | None = None) -> dict[str, Any]:
    """``selector``: the pods to serve from (default: all of the LLMDeployment's)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector or selector_labels(owner["metadata"]["name"]),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
