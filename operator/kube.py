"""The few API calls the operator makes, on any kind it owns, through one ``ApiClient``.

Children are written with server-side apply (field manager ``kvserve-operator``, conflicts
forced): the operator states the whole object it wants and the API server merges it. Applying
an unchanged object is a no-op on the server (no new resourceVersion), which is what makes
reconciliation idempotent and safe to repeat after a restart.

A status is written with the owner's ``resourceVersion`` as a precondition: the API server
refuses it (409 Conflict) when the owner changed since it was read.
"""

import base64
import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kvserve.operator.resource import FIELD_MANAGER, PLURAL

PLURALS = {
    "Deployment": "deployments",
    "Service": "services",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "PodMonitor": "podmonitors",
    "InferencePool": "inferencepools",
    "LeaderWorkerSet": "leaderworkersets",
    "InferenceModelRewrite": "inferencemodelrewrites",
    "Pod": "pods",
    "Secret": "secrets",
    "LLMDeployment": PLURAL,
}


def api_message(error: ApiException) -> str:
    """The message of the API server's Status answer (it names the cause, e.g. "... because it
    is being terminated"), else the HTTP status line."""
    if error.body is not None:
        try:
            return json.loads(error.body)["message"]
        except (TypeError, ValueError, KeyError):
            pass
    return f"{error.status} {error.reason}"


def namespace_terminating(error: ApiException) -> bool:
    """Whether the API server refused a write because its namespace is being deleted."""
    if error.body is None:
        return False
    try:
        causes = json.loads(error.body)["details"]["causes"]
    except (TypeError, ValueError, KeyError):
        return False
    return error.status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in causes)


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{PLURALS[kind]}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{name}"


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
        query: list[tuple[str, Any]] | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        method, url, headers, body, _ = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(method, url, header_params=headers, body=body)
        text = response.read().decode()
        if not 200 <= response.status < 300:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        return json.loads(text)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        return self._call("PATCH", path, obj, "application/apply-patch+yaml", query)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", object_path(api_version, kind, namespace, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """The value under ``key`` of the Secret ``name``, decoded; None when the Secret or
        the key is missing (other API errors raise)."""
        secret = self.get("v1", "Secret", namespace, name)
        value = None if secret is None else (secret.get("data") or {}).get(key)
        return None if value is None else base64.b64decode(value).decode()

    def list_labelled(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]:
        """The objects of ``kind`` in ``namespace`` whose labels match ``selector``."""
        path = collection_path(api_version, kind, namespace)
        return self._call("GET", path, query=[("labelSelector", selector)])["items"]

    def set_pod_condition(self, namespace: str, name: str, kind: str) -> None:
        """Set the condition ``kind`` of a pod True (a readiness gate's); the pod's other
        conditions stay (a strategic merge by type)."""
        path = object_path("v1", "Pod", namespace, name) + "/status"
        condition = {"type": kind, "status": "True"}
        body = {"status": {"conditions": [condition]}}
        self._call("PATCH", path, body, "application/strategic-merge-patch+json")

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete if present; return whether there was something to delete."""
        try:
            self._call("DELETE", object_path(api_version, kind, namespace, name))
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def patch_status(self, owner: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Merge ``status`` into ``owner``'s, provided ``owner`` is still its current version."""
        meta = owner["metadata"]
        path = object_path(owner["apiVersion"], owner["kind"], meta["namespace"], meta["name"])
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        return self._call("PATCH", path + "/status", body, "application/merge-patch+json")
