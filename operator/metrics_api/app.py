"""The aiohttp application: discovery, per-pod metric values, and the auth checks before both.

Pods are looked up by the API server with the caller's ``labelSelector`` (what the HPA passes:
its target's pod selector) narrowed to LLMDeployment pods, so the server never scrapes any
other pod whatever the caller asks. ``/healthz`` and ``/readyz`` answer anyone (the kubelet's
probes carry no client certificate); everything else needs the front proxy and a caller the
API server authorises.
"""

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from kvserve.operator.metrics_api.answers import (
    GROUP,
    VERSIONS,
    api_group,
    api_group_list,
    api_resource_list,
    metric_value_list,
    status,
)
from kvserve.operator.metrics_api.auth import (
    Authorizer,
    RequestHeaderConfig,
    Unauthenticated,
    authenticate,
)
from kvserve.operator.metrics_api.catalog import SERVED_METRICS
from kvserve.operator.metrics_api.scrape import Scraper, ready_targets
from kvserve.operator.resource import INSTANCE_LABEL

PodLister = Callable[[str, str], Awaitable[list[dict[str, Any]]]]
"""(namespace, label selector) → the pods the API server lists; ``LookupError`` when the API
server rejects the selector (its message as the argument)."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/livez"})
GROUP_PATH = f"/apis/{GROUP}"
SCRAPER = web.AppKey("scraper", Scraper)


def _answer(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(status(code, reason, message), status=code)


def request_attributes(request: web.Request) -> dict[str, Any]:
    """What a SubjectAccessReview asks about this request (as kube's RequestInfo reads it)."""
    info = request.match_info
    if "metric" not in info:
        return {"path": request.path, "verb": "get"}
    attributes = {
        "namespace": info["namespace"],
        "verb": "list" if info["name"] == "*" else "get",
        "group": GROUP,
        "version": info["version"],
        "resource": "pods",
        "subresource": info["metric"],
    }
    if info["name"] != "*":
        attributes["name"] = info["name"]
    return attributes


def pod_selector(selector: str) -> str:
    """The caller's selector, narrowed to pods of LLMDeployments."""
    return f"{INSTANCE_LABEL},{selector}" if selector else INSTANCE_LABEL


def make_app(
    config: RequestHeaderConfig,
    authorizer: Authorizer,
    list_pods: PodLister,
    scrape_timeout: float = 2.0,
    max_age: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> web.Application:
    @web.middleware
    async def delegated_auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        try:
            user = authenticate(request, config)
        except Unauthenticated as e:
            return _answer(401, "Unauthorized", str(e))
        allowed, reason = await authorizer.allowed(user, request_attributes(request))
        if not allowed:
            why = f": {reason}" if reason else ""
            message = f"user {user.name!r} may not {request.method} {request.path}{why}"
            return _answer(403, "Forbidden", message)
        return await handler(request)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def group_list(_: web.Request) -> web.Response:
        return web.json_response(api_group_list())

    async def group(_: web.Request) -> web.Response:
        return web.json_response(api_group())

    async def resources(request: web.Request) -> web.Response:
        version = request.match_info["version"]
        if version not in VERSIONS:
            return _answer(404, "NotFound", f"{GROUP}/{version} is not served")
        return web.json_response(api_resource_list(version))

    async def pod_metric(request: web.Request) -> web.Response:
        info = request.match_info
        version, namespace, name, metric = (
            info["version"],
            info["namespace"],
            info["name"],
            info["metric"],
        )
        if version not in VERSIONS:
            return _answer(404, "NotFound", f"{GROUP}/{version} is not served")
        if metric not in SERVED_METRICS:
            return _answer(
                404, "NotFound", f"the server could not find the metric {metric} for pods"
            )
        if request.query.get("metricLabelSelector"):
            return _answer(400, "BadRequest", "metric label selectors are not supported")
        try:
            pods = await list_pods(namespace, pod_selector(request.query.get("labelSelector", "")))
        except LookupError as e:
            return _answer(400, "BadRequest", str(e))
        if name != "*":
            pods = [p for p in pods if p["metadata"]["name"] == name]
        samples = await request.app[SCRAPER].samples(ready_targets(pods))
        answer = metric_value_list(version, metric, samples)
        if name != "*" and not answer["items"]:
            message = f"the server could not find the metric {metric} for pods {name}"
            return _answer(404, "NotFound", message)
        return web.json_response(answer)

    async def not_found(request: web.Request) -> web.Response:
        return _answer(404, "NotFound", f"the server could not find {request.path}")

    async def scraper(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as session:
            app[SCRAPER] = Scraper(session, scrape_timeout, max_age, clock)
            yield

    app = web.Application(middlewares=[delegated_auth])
    app.cleanup_ctx.append(scraper)
    for path in OPEN_PATHS:
        app.router.add_get(path, health)
    app.router.add_get("/apis", group_list)
    app.router.add_get(GROUP_PATH, group)
    app.router.add_get(GROUP_PATH + "/{version}", resources)
    app.router.add_get(
        GROUP_PATH + "/{version}/namespaces/{namespace}/pods/{name}/{metric}", pod_metric
    )
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app
