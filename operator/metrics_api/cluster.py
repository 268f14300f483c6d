"""The three API calls the metrics server makes, raw JSON in and out (blocking: run in a thread).

Each needs one RBAC grant (charts/kvserve-operator/templates/metrics-api-rbac.yaml): get on
the ``extension-apiserver-authentication`` ConfigMap, list on pods, create on
SubjectAccessReviews.

With ``_preload_content=False`` the client returns the urllib3 response, unread, though its
hints name the decoded model whatever the flag: hence the ``attr-defined`` ignores on ``.data``.
"""

import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kvserve.operator.metrics_api.auth import AUTH_CONFIGMAP, RequestHeaderConfig

TIMEOUT = 5.0


def read_requestheader_config(api: client.ApiClient) -> RequestHeaderConfig:
    namespace, name = AUTH_CONFIGMAP
    config_map = client.CoreV1Api(api).read_namespaced_config_map(
        name, namespace, _request_timeout=TIMEOUT
    )
    return RequestHeaderConfig.from_configmap(config_map.data or {})


def list_pods(api: client.ApiClient, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods ``selector`` selects; LookupError (the API server's message) when it is invalid."""
    try:
        response = client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False, _request_timeout=TIMEOUT
        )
    except ApiException as e:
        if e.status == 400:
            message = json.loads(e.body).get("message", e.reason) if e.body else e.reason
            raise LookupError(message) from e
        raise
    return json.loads(response.data)["items"]  # type: ignore[attr-defined]


def review_access(api: client.ApiClient, review: dict[str, Any]) -> dict[str, Any]:
    response = client.AuthorizationV1Api(api).create_subject_access_review(
        review,  # type: ignore[arg-type]  # a dict body is sent as it is; the hint names the model
        _preload_content=False,
        _request_timeout=TIMEOUT,
    )
    return json.loads(response.data)  # type: ignore[attr-defined]
