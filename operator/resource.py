"""The LLMDeployment resource's identity and the labels that tie its children to it.

Every child carries the same selector labels and an owner reference with ``controller: true``,
so the garbage collector removes them with their LLMDeployment and the operator can find the
owner of any child it watches.
"""

from typing import Any

GROUP = "kvserve.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMDeployment"
PLURAL = "llmdeployments"

FIELD_MANAGER = "kvserve-operator"
INSTANCE_LABEL = f"{GROUP}/llmdeployment"
MANAGED_BY = {"app.kubernetes.io/managed-by": FIELD_MANAGER}

HTTP_PORT = 8000
"""The one port of a serving pod: OpenAI API, /health, /ready and /metrics."""


def selector_labels(name: str) -> dict[str, str]:
    """Labels that select one LLMDeployment's pods; immutable once a Deployment exists."""
    return {"app.kubernetes.io/name": "kvserve", INSTANCE_LABEL: name}


def labels(name: str) -> dict[str, str]:
    """Labels put on every child and on every pod of the LLMDeployment ``name``."""
    return {**selector_labels(name), "app.kubernetes.io/component": "server", **MANAGED_BY}


def selector_string(name: str) -> str:
    """``selector_labels`` as a label-selector string, as the scale subresource reports it."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(name).items())


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(owner: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "name": name or meta["name"],
        "namespace": meta["namespace"],
        "labels": labels(meta["name"]),
        "ownerReferences": [owner_reference(owner)],
    }
