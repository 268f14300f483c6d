"""Only the front proxy gets in, and only for callers the API server authorises."""

import asyncio

import aiohttp
import pytest

from kvserve.operator.autoscaler import WAITING_METRIC
from kvserve.operator.metrics_api.auth import RequestHeaderConfig
from metrics_api.harness import Cluster, metrics_api

METRIC_PATH = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/ml/pods/*/{WAITING_METRIC}"


def _unauthorized(message: str) -> tuple[int, dict]:
    return 401, {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Unauthorized",
        "code": 401,
    }


def test_a_request_without_a_client_certificate_is_refused(pki, clock):
    async def run():
        cluster = Cluster()
        async with metrics_api(pki, cluster, clock) as api:
            return await api.get_without_certificate(METRIC_PATH), cluster

    answer, cluster = asyncio.run(run())
    assert answer == _unauthorized(
        "a client certificate signed by the requestheader CA is required"
    )
    assert (cluster.reviews, cluster.listed) == ([], [])


def test_a_certificate_from_another_ca_fails_the_handshake(pki, clock):
    async def run():
        cluster = Cluster()
        async with metrics_api(pki, cluster, clock) as api:
            with pytest.raises(aiohttp.ClientError) as refused:
                await api.get(METRIC_PATH, client=pki.foreign_client)
            return refused.value, cluster

    error, cluster = asyncio.run(run())
    # TLS 1.3: the client's handshake ends before the server checks the certificate, so the
    # client sees the connection dropped (with the server's "unknown ca" alert) on its request.
    assert isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
    assert (cluster.reviews, cluster.listed) == ([], [])


def test_the_requestheader_ca_signed_a_certificate_with_a_name_not_allowed(pki, clock):
    async def run():
        async with metrics_api(pki, Cluster(), clock) as api:
            return await api.get(METRIC_PATH, client=pki.unlisted_client)

    assert asyncio.run(run()) == _unauthorized(
        "client certificate CN 'someone-else' is not an allowed front proxy"
    )


def test_the_front_proxy_must_name_a_user(pki, clock):
    async def run():
        async with metrics_api(pki, Cluster(), clock) as api:
            return await api.get(METRIC_PATH, user=None)

    assert asyncio.run(run()) == _unauthorized("the front proxy named no user")


def test_the_front_proxys_user_is_authorised_with_a_subject_access_review(pki, clock):
    async def run():
        cluster = Cluster()
        async with metrics_api(pki, cluster, clock) as api:
            extra = {"X-Remote-Extra-Scopes": "a b", "X-Remote-Extra-Acme.com%2fteam": "ml"}
            answers = [
                await api.get(METRIC_PATH),
                await api.get(METRIC_PATH),  # the decision is cached
                await api.get(METRIC_PATH.replace("*", "pod-1")),
                await api.get("/apis/custom.metrics.k8s.io", user="jane", groups=("dev",)),
                await api.get(METRIC_PATH, user="jane", groups=("dev",), headers=extra),
            ]
            clock.now += 10.0
            answers.append(await api.get(METRIC_PATH))  # reviewed again once it expired
            return answers, cluster

    answers, cluster = asyncio.run(run())
    assert [a[0] for a in answers] == [200, 200, 404, 403, 403, 200]
    assert answers[3][1]["message"] == (
        "user 'jane' may not GET /apis/custom.metrics.k8s.io: no RBAC policy matched"
    )
    assert (answers[3][1]["reason"], answers[3][1]["code"]) == ("Forbidden", 403)
    aggregator = {
        "user": "system:kube-aggregator",
        "groups": ["system:masters", "system:authenticated"],
    }
    listing = {
        "namespace": "ml",
        "verb": "list",
        "group": "custom.metrics.k8s.io",
        "version": "v1beta1",
        "resource": "pods",
        "subresource": WAITING_METRIC,
    }
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview"}
    assert cluster.reviews == [
        {**review, "spec": {**aggregator, "resourceAttributes": listing}},
        {
            **review,
            "spec": {
                **aggregator,
                "resourceAttributes": {**listing, "verb": "get", "name": "pod-1"},
            },
        },
        {
            **review,
            "spec": {
                "user": "jane",
                "groups": ["dev"],
                "nonResourceAttributes": {"path": "/apis/custom.metrics.k8s.io", "verb": "get"},
            },
        },
        {
            **review,
            "spec": {
                "user": "jane",
                "groups": ["dev"],
                "extra": {"scopes": ["a b"], "acme.com/team": ["ml"]},
                "resourceAttributes": listing,
            },
        },
        {**review, "spec": {**aggregator, "resourceAttributes": listing}},
    ]
    assert cluster.listed == [("ml", "kvserve.io/llmdeployment")] * 4  # none for 403s


def test_health_needs_no_certificate(pki, clock):
    async def run():
        async with metrics_api(pki, Cluster(), clock) as api:
            context = pki.client_context(None)
            async with api.session.get(api.url + "/healthz", ssl=context) as response:
                return response.status, await response.text()

    assert asyncio.run(run()) == (200, "ok")


def test_requestheader_config_from_the_apiservers_configmap(pki):
    ca = pki.requestheader_ca.cert.read_text()
    data = {
        "client-ca-file": "ignored",
        "requestheader-client-ca-file": ca,
        "requestheader-allowed-names": '["front-proxy-client"]',
        "requestheader-username-headers": '["X-Remote-User"]',
        "requestheader-group-headers": '["X-Remote-Group"]',
        "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    }
    assert RequestHeaderConfig.from_configmap(data) == RequestHeaderConfig(
        ca, ("front-proxy-client",), ("X-Remote-User",), ("X-Remote-Group",), ("X-Remote-Extra-",)
    )
    assert RequestHeaderConfig.from_configmap(
        {"requestheader-client-ca-file": ca, "requestheader-allowed-names": "[]"}
    ) == RequestHeaderConfig(ca)
    with pytest.raises(ValueError, match="aggregation layer is not configured"):
        RequestHeaderConfig.from_configmap({"client-ca-file": ca})
