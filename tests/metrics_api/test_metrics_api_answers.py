"""The answers the HPA decodes: discovery, MetricValueLists of both versions, which pods count."""

import asyncio
import re
from contextlib import AsyncExitStack
from datetime import UTC, datetime

from kvserve.operator.autoscaler import KV_USAGE_METRIC, WAITING_METRIC
from kvserve.operator.metrics_api.answers import quantity
from kvserve.operator.metrics_api.scrape import parse_exposition
from metrics_api.harness import Cluster, PodServer, exposition, metrics_api, pod_manifest

GROUP_PATH = "/apis/custom.metrics.k8s.io"
SELECTOR = "kvserve.io/llmdeployment,app.kubernetes.io/name=kvserve,kvserve.io/llmdeployment=demo"
HPA_QUERY = {"labelSelector": "app.kubernetes.io/name=kvserve,kvserve.io/llmdeployment=demo"}
RESOURCES = [
    {
        "name": f"pods/{name}",
        "singularName": "",
        "namespaced": True,
        "kind": "MetricValueList",
        "verbs": ["get"],
    }
    for name in (WAITING_METRIC, "vllm_num_requests_running", KV_USAGE_METRIC)
]


def _pod(name: str) -> dict:
    return {"kind": "Pod", "namespace": "ml", "name": name, "apiVersion": "v1"}


def _timestamp_is_now(item: dict) -> bool:
    stamp = item.pop("timestamp")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)
    taken = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return abs((datetime.now(UTC) - taken).total_seconds()) < 30


async def _serving(stack: AsyncExitStack, *servers: PodServer) -> list[PodServer]:
    return [await stack.enter_async_context(s.running()) for s in servers]


def test_discovery_documents(pki, clock):
    async def run():
        async with metrics_api(pki, Cluster(), clock) as api:
            return [
                await api.get(p)
                for p in (
                    "/apis",
                    GROUP_PATH,
                    f"{GROUP_PATH}/v1beta1",
                    f"{GROUP_PATH}/v1beta2",
                    f"{GROUP_PATH}/v1",
                    "/api/v1/pods",
                )
            ]

    apis, group, beta1, beta2, unknown, elsewhere = asyncio.run(run())
    versions = [
        {"groupVersion": "custom.metrics.k8s.io/v1beta2", "version": "v1beta2"},
        {"groupVersion": "custom.metrics.k8s.io/v1beta1", "version": "v1beta1"},
    ]
    group_doc = {"name": "custom.metrics.k8s.io", "versions": versions}
    group_doc["preferredVersion"] = versions[0]
    assert apis == (200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_doc]})
    assert group == (200, {"kind": "APIGroup", "apiVersion": "v1", **group_doc})
    for version, answer in (("v1beta1", beta1), ("v1beta2", beta2)):
        assert answer == (
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"custom.metrics.k8s.io/{version}",
                "resources": RESOURCES,
            },
        )
    assert (unknown[0], unknown[1]["reason"]) == (404, "NotFound")
    assert unknown[1]["message"] == "custom.metrics.k8s.io/v1 is not served"
    assert elsewhere == (
        404,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "the server could not find /api/v1/pods",
            "reason": "NotFound",
            "code": 404,
        },
    )


def test_metric_value_lists_in_each_versions_shape(pki, clock):
    async def run():
        async with AsyncExitStack() as stack:
            a, b = await _serving(
                stack, PodServer(exposition(3, 4, 0.25)), PodServer(exposition(0, 1, 0.0625))
            )
            cluster = Cluster(
                {("ml", SELECTOR): [pod_manifest("a", a.port), pod_manifest("b", b.port)]}
            )
            api = await stack.enter_async_context(metrics_api(pki, cluster, clock))
            paths = [
                f"{GROUP_PATH}/{v}/namespaces/ml/pods/*/{m}"
                for v in ("v1beta1", "v1beta2")
                for m in (WAITING_METRIC, "vllm_num_requests_running", KV_USAGE_METRIC)
            ]
            answers = [await api.get(p, **HPA_QUERY) for p in paths]
            return answers, a.hits, b.hits, cluster.listed

    answers, a_hits, b_hits, listed = asyncio.run(run())
    assert (a_hits, b_hits) == (1, 1)  # six reads, one scrape per pod
    assert listed == [("ml", SELECTOR)] * 6
    expected = {
        WAITING_METRIC: ["3", "0"],
        "vllm_num_requests_running": ["4", "1"],
        KV_USAGE_METRIC: ["250m", "62m"],
    }
    for index, (status, body) in enumerate(answers):
        version = "v1beta1" if index < 3 else "v1beta2"
        metric = list(expected)[index % 3]
        assert status == 200
        assert all(_timestamp_is_now(item) for item in body["items"])
        if version == "v1beta1":
            items = [
                {
                    "describedObject": _pod(name),
                    "metricName": metric,
                    "value": value,
                    "selector": None,
                }
                for name, value in zip("ab", expected[metric], strict=True)
            ]
        else:
            items = [
                {"describedObject": _pod(name), "metric": {"name": metric}, "value": value}
                for name, value in zip("ab", expected[metric], strict=True)
            ]
        assert body == {
            "kind": "MetricValueList",
            "apiVersion": f"custom.metrics.k8s.io/{version}",
            "metadata": {},
            "items": items,
        }


def test_a_named_pod_is_a_list_of_one_and_a_pod_without_a_value_is_not_found(pki, clock):
    async def run():
        async with AsyncExitStack() as stack:
            (a,) = await _serving(stack, PodServer(exposition(2, 1, 0.5)))
            pods = [pod_manifest("a", a.port), pod_manifest("b", a.port, ready=False)]
            cluster = Cluster({("ml", "kvserve.io/llmdeployment"): pods})
            api = await stack.enter_async_context(metrics_api(pki, cluster, clock))
            path = f"{GROUP_PATH}/v1beta2/namespaces/ml/pods/%s/{WAITING_METRIC}"
            return [await api.get(path % name) for name in ("a", "b", "zz")]

    (found, body), not_ready, absent = asyncio.run(run())
    assert (found, _timestamp_is_now(body["items"][0])) == (200, True)
    assert body["items"] == [
        {"describedObject": _pod("a"), "metric": {"name": WAITING_METRIC}, "value": "2"}
    ]
    for (status, error), name in ((not_ready, "b"), (absent, "zz")):
        assert (status, error["reason"]) == (404, "NotFound")
        assert error["message"] == (
            f"the server could not find the metric {WAITING_METRIC} for pods {name}"
        )


def test_only_llmdeployment_pods_are_listed_and_a_bad_selector_is_400(pki, clock):
    async def run():
        cluster = Cluster()
        async with metrics_api(pki, cluster, clock) as api:
            path = f"{GROUP_PATH}/v1beta1/namespaces/%s/pods/*/{WAITING_METRIC}"
            answers = [
                await api.get(path % "ml"),
                await api.get(path % "other", labelSelector="app=x"),
                await api.get(path % "ml", labelSelector="app!!x"),
            ]
            return answers, cluster.listed

    (none, elsewhere, bad), listed = asyncio.run(run())
    assert listed == [
        ("ml", "kvserve.io/llmdeployment"),
        ("other", "kvserve.io/llmdeployment,app=x"),
        ("ml", "kvserve.io/llmdeployment,app!!x"),
    ]
    for status, body in (none, elsewhere):
        assert (status, body["items"]) == (200, [])
    assert (bad[0], bad[1]["reason"]) == (400, "BadRequest")
    assert bad[1]["message"] == "unable to parse requirement: kvserve.io/llmdeployment,app!!x"


def test_unknown_metric_and_metric_selectors_are_refused(pki, clock):
    async def run():
        async with metrics_api(pki, Cluster(), clock) as api:
            path = f"{GROUP_PATH}/v1beta1/namespaces/ml/pods/*/%s"
            return (
                await api.get(path % "vllm:num_requests_waiting"),
                await api.get(path % WAITING_METRIC, metricLabelSelector="model_name=m"),
            )

    unknown, selected = asyncio.run(run())
    assert (unknown[0], unknown[1]["message"]) == (
        404,
        "the server could not find the metric vllm:num_requests_waiting for pods",
    )
    assert (selected[0], selected[1]["message"]) == (
        400,
        "metric label selectors are not supported",
    )


def test_pods_that_are_not_ready_or_do_not_answer_properly_are_left_out(pki, clock):
    async def run():
        async with AsyncExitStack() as stack:
            good, garbage, failing, slow, idle = await _serving(
                stack,
                PodServer(exposition(5, 1, 0.5)),
                PodServer("<html><body>502 Bad Gateway</body></html>"),
                PodServer(exposition(9, 9, 0.9), status=500),
                PodServer(exposition(9, 9, 0.9), delay=2.0),
                PodServer(exposition(9, 9, 0.9)),
            )
            other_families = await stack.enter_async_context(PodServer("up 1\n").running())
            pods = [
                pod_manifest("good", good.port),
                pod_manifest("garbage", garbage.port),
                pod_manifest("failing", failing.port),
                pod_manifest("slow", slow.port),
                pod_manifest("no-metrics", other_families.port),
                pod_manifest("not-ready", idle.port, ready=False),
                pod_manifest("pending", idle.port, phase="Pending", ip=None),
                pod_manifest("terminating", idle.port, deleting=True),
                pod_manifest("gone", _closed_port()),
            ]
            cluster = Cluster({("ml", "kvserve.io/llmdeployment"): pods})
            api = await stack.enter_async_context(
                metrics_api(pki, cluster, clock, scrape_timeout=0.5)
            )
            started = asyncio.get_running_loop().time()
            answer = await api.get(f"{GROUP_PATH}/v1beta1/namespaces/ml/pods/*/{WAITING_METRIC}")
            took = asyncio.get_running_loop().time() - started
            hits = [s.hits for s in (good, garbage, failing, slow, other_families, idle)]
            return answer, took, hits

    (status, body), took, hits = asyncio.run(run())
    assert status == 200
    assert [(i["describedObject"]["name"], i["value"]) for i in body["items"]] == [("good", "5")]
    assert hits == [1, 1, 1, 1, 1, 0]  # the not-ready, pending, terminating pods: never dialled
    assert took < 1.5  # scraped concurrently: one timeout, not one per pod


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_samples_are_reused_for_max_age_then_never_served_stale(pki, clock):
    async def run():
        async with AsyncExitStack() as stack:
            (pod,) = await _serving(stack, PodServer(exposition(4, 0, 0.0)))
            cluster = Cluster({("ml", "kvserve.io/llmdeployment"): [pod_manifest("a", pod.port)]})
            api = await stack.enter_async_context(metrics_api(pki, cluster, clock))
            path = f"{GROUP_PATH}/v1beta1/namespaces/ml/pods/*/{WAITING_METRIC}"

            async def values() -> list[str]:
                return [i["value"] for i in (await api.get(path))[1]["items"]]

            seen = [await values() for _ in range(2)]  # both within max_age: one scrape
            pod.body = exposition(7, 0, 0.0)
            clock.now += 4.9
            seen.append(await values())  # still the first sample
            clock.now += 0.1
            seen.append(await values())  # 5 s old: scraped again
            hits = [pod.hits]
            pod.body = "garbage"
            clock.now += 5.0
            seen.append(await values())  # the pod fails: the old value is not served
            seen.append(await values())  # nor re-dialled on every read
            clock.now += 5.0
            pod.body = exposition(1, 0, 0.0)
            seen.append(await values())
            hits.append(pod.hits)
            both = await asyncio.gather(api.get(path), api.get(path))
            return seen, hits, both, pod.hits

    seen, hits, both, final_hits = asyncio.run(run())
    assert seen == [["4"], ["4"], ["4"], ["7"], [], [], ["1"]]
    assert hits == [2, 4]
    assert ([b[1]["items"][0]["value"] for b in both], final_hits) == (["1", "1"], 4)


def test_concurrent_reads_share_one_scrape(pki, clock):
    async def run():
        async with AsyncExitStack() as stack:
            (pod,) = await _serving(stack, PodServer(exposition(2, 0, 0.0), delay=0.2))
            cluster = Cluster({("ml", "kvserve.io/llmdeployment"): [pod_manifest("a", pod.port)]})
            api = await stack.enter_async_context(metrics_api(pki, cluster, clock))
            path = f"{GROUP_PATH}/v1beta1/namespaces/ml/pods/*/%s"
            answers = await asyncio.gather(
                api.get(path % WAITING_METRIC), api.get(path % KV_USAGE_METRIC)
            )
            return answers, pod.hits

    answers, hits = asyncio.run(run())
    assert ([a[1]["items"][0]["value"] for a in answers], hits) == (["2", "0"], 1)


def test_exposition_values_per_pod():
    two_models = exposition(2, 1, 0.25, model="a") + exposition(3, 0, 0.5, model="b")
    two_models = "\n".join(x for x in two_models.splitlines() if not x.startswith("#"))
    assert parse_exposition(two_models) == {
        WAITING_METRIC: 5.0,
        "vllm_num_requests_running": 1.0,
        KV_USAGE_METRIC: 0.5,
    }
    assert parse_exposition('vllm:num_requests_waiting{model_name="m"} NaN\nup 1\n') == {}
    assert parse_exposition("") == {}


def test_quantities_are_canonical():
    assert [quantity(v) for v in (0, 3, 1.5, 0.25, 0.0625, 0.9999, 1e-4)] == [
        "0", "3", "1500m", "250m", "62m", "1", "0",
    ]  # fmt: skip
