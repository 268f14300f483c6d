"""The end-to-end scenarios: a user's whole path on a real cluster, with real pods and traffic.

Run in order, each on what the previous ones left (see README.md): install the operator, serve
the demo model, scale it to zero, fail a download that cannot resolve its hub, scale, roll,
replace a pod, survive an invalid spec, delete; then serve with two tensor-parallel ranks on a
pod's CPUs, the image's real model, and LoRA adapters added without a restart. Each returns a
one-line summary and raises on the first failed check; after each, the operator's log must
hold no Forbidden answer and no traceback. A new scenario (e.g.
autoscaling) is one function and one entry in ``SCENARIOS``.

    python e2e/scenarios.py [--access clusterip|port-forward] [--only NAME ...]
"""

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
import zmq
from cluster import Access, Cluster, wait_for
from kubernetes.client import V1Pod
from openai import APIConnectionError
from rollout import HTTP_PORT, RolloutTraffic
from traffic import MODEL, chat, http_get, metric_sum, openai_client, stream_completion

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kvserve-operator"
API = ("kvserve.io", "v1alpha1", "llmdeployments")
DEMO_MODEL = "/opt/kvserve/models/demo"
RESYNC_SECONDS = 10
READY_TIMEOUT = 300.0
STREAM_TOKENS = 900
"""Long streams: the demo model's context is 1024 tokens."""
SPREAD_REQUESTS = 16
LOG_PROBLEMS = ("Forbidden", " 403", "Traceback")


@dataclass
class Context:
    cluster: Cluster
    namespace: str = "kvserve-e2e"
    operator_namespace: str = "kvserve-system"
    release: str = "kvs"
    image: str = "localhost/kvserve:dev"
    pull_policy: str = "IfNotPresent"
    name: str = "demo"
    chart_values: tuple[str, ...] = ("metricsAPI.enabled=false",)
    """``--set`` values of the operator chart; its custom-metrics API is for autoscaling."""
    operator_log_checked: dict[str, int] = field(default_factory=dict)
    """Per operator pod: how much of its log is checked."""
    inference_pool_crd: dict[str, Any] | None = None
    """The InferencePool CRD the gateway scenario installs where the cluster serves none (the
    tests pass the published one, as a v1.20 server takes it). None: on such a cluster the
    scenario checks the condition that reports the missing API instead."""
    name_resolution_error: str = "[Errno -2] Name or service not known"
    """What a pod's resolver says of a name under ``.invalid``. The default is the answer where
    a cluster DNS says that no such name exists (kind's CoreDNS); the project's node, which has
    no DNS, passes its own."""

    @property
    def operator(self) -> str:
        return f"{self.release}-kvserve-operator"

    @property
    def selector(self) -> str:
        return f"kvserve.io/llmdeployment={self.name}"

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.cluster.kubectl("-n", self.namespace, *args, stdin=stdin)

    def llmd(self) -> dict[str, Any]:
        return self.cluster.custom.get_namespaced_custom_object(
            *API[:2], self.namespace, API[2], self.name
        )

    def pods(self) -> list[V1Pod]:
        found = self.cluster.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        return sorted(found.items, key=lambda p: p.metadata.name)


def demo_spec(replicas: int = 1, max_num_seqs: int = 8) -> dict[str, Any]:
    """The demo model on CPU, small enough for three pods (a surge) on a 2-core node."""
    return {
        "model": {"source": DEMO_MODEL, "servedName": MODEL},
        "replicas": replicas,
        "resources": {"cpu": "500m", "memory": "1Gi"},
        "engine": {"maxNumSeqs": max_num_seqs},
        "drain": {"timeoutSeconds": 30},
    }


def _ready(pod: V1Pod) -> bool:
    conditions = pod.status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def condition(body: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def _table(ctx: Context, name: str) -> list[list[str]]:
    """``kubectl get llmd NAME``'s header and row, AGE left out."""
    return [line.split()[:5] for line in ctx.kubectl("get", "llmd", name).splitlines()]


HEADER = ["NAME", "MODEL", "REPLICAS", "READY", "PHASE"]


def _conditions(body: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) of each condition, in the status's order."""
    return [
        (c["type"], c["status"], c["reason"], c["message"]) for c in body["status"]["conditions"]
    ]


def _warnings(ctx: Context, uid: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of each Warning Event about the object ``uid``."""
    found = ctx.cluster.core.list_namespaced_event(
        ctx.namespace, field_selector=f"involvedObject.uid={uid},type=Warning"
    ).items
    return [(e.type, e.reason, e.message) for e in found]


def wait_ready(ctx: Context, replicas: int, timeout: float = READY_TIMEOUT) -> list[V1Pod]:
    """Phase Ready for the current generation, and exactly ``replicas`` pods, all Ready."""

    def settled() -> list[V1Pod] | None:
        body = ctx.llmd()
        status = body.get("status") or {}
        if (
            status.get("phase") != "Ready"
            or status.get("readyReplicas") != replicas
            or status.get("observedGeneration") != body["metadata"]["generation"]
        ):
            return None
        pods = ctx.pods()
        live = [p for p in pods if not p.metadata.deletion_timestamp]
        ok = len(live) == len(pods) == replicas and all(_ready(p) for p in live)
        return live if ok else None

    return wait_for(settled, f"{ctx.name} Ready with {replicas} pods", timeout)


def _pod_metrics(ctx: Context, pod: V1Pod) -> str:
    with ctx.cluster.pod_url(pod, HTTP_PORT) as base:
        status, body = http_get(f"{base}/metrics")
    assert status == 200, (pod.metadata.name, status, body[:200])
    return body


def _served(ctx: Context, pods: list[V1Pod]) -> dict[str, float]:
    """Finished requests per pod, from each pod's own /metrics."""
    return {p.metadata.name: metric_sum(_pod_metrics(ctx, p), "vllm:request_success") for p in pods}


def install_operator(ctx: Context) -> str:
    repo, tag = ctx.image.rsplit(":", 1)
    # Helm 4 installs by server-side apply, on which kube-apiserver 1.20's aggregator panics for
    # an APIService ("FieldManager must be installed to run apply"): apply client-side.
    client_side = ["--server-side=false"] if ctx.cluster.helm_major() >= 4 else []
    ctx.cluster.helm(
        "upgrade", "--install", ctx.release, str(CHART), *client_side,
        "--namespace", ctx.operator_namespace, "--create-namespace",
        "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
        "--set", f"image.pullPolicy={ctx.pull_policy}",
        "--set", f"resyncSeconds={RESYNC_SECONDS}", "--wait", "--timeout", "5m",
        *(arg for value in ctx.chart_values for arg in ("--set", value)),
    )  # fmt: skip
    (pod,) = wait_for(
        lambda: [p for p in operator_pods(ctx) if _ready(p) and not p.metadata.deletion_timestamp],
        "the operator pod Ready",
        READY_TIMEOUT,
    )
    assert pod.spec.service_account_name == ctx.operator, pod.spec.service_account_name
    exec_id = ("exec", "-n", ctx.operator_namespace, pod.metadata.name, "--", "id", "-u")
    assert ctx.cluster.kubectl(*exec_id).strip() == "1000"
    with ctx.cluster.pod_url(pod, 8080) as base:
        wait_for(lambda: http_get(f"{base}/healthz")[0] == 200, "kopf's liveness endpoint", 120)
    account = f"system:serviceaccount:{ctx.operator_namespace}:{ctx.operator}"
    expected = {
        ("patch", "llmdeployments.kvserve.io"): "yes",
        ("patch", "llmdeployments.kvserve.io", "--subresource=status"): "yes",
        ("patch", "deployments.apps"): "yes",
        ("create", "events"): "yes",
        ("get", "secrets"): "yes",  # apiKeySecret's key, sent on the adapter calls
        ("create", "pods"): "no",
        ("delete", "deployments.apps"): "yes",  # replaced by a LeaderWorkerSet
    }
    answers = {
        question: ctx.cluster.kubectl(
            "auth", "can-i", *question, "-n", ctx.namespace, "--as", account, check=False
        ).strip()
        for question in expected
    }
    assert answers == expected, answers
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ctx.namespace}}
    ctx.cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    ctx.kubectl("delete", "llmd", "--all", "--wait=true", "--timeout=180s")
    return f"operator pod {pod.metadata.name} Ready as {account}, uid 1000"


def serve_demo(ctx: Context) -> str:
    body = {"apiVersion": "/".join(API[:2]), "kind": "LLMDeployment",
            "metadata": {"name": ctx.name}, "spec": demo_spec()}  # fmt: skip
    ctx.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    (pod,) = wait_ready(ctx, 1)
    status = ctx.llmd()["status"]
    assert status["endpoint"] == f"http://{ctx.name}.{ctx.namespace}.svc:8000/v1", status
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Available", "True"), ("Progressing", "False"), ("Degraded", "False"),
        ("ModelLoaded", "True"),
    ], status  # fmt: skip
    # The load time is the pod's own: its server's start to its Ready condition.
    started = pod.status.container_statuses[0].state.running.started_at
    ready_at = next(c.last_transition_time for c in pod.status.conditions if c.type == "Ready")
    load_seconds = round((ready_at - started).total_seconds())
    assert status["modelLoadSeconds"] == load_seconds and 1 <= load_seconds <= READY_TIMEOUT
    assert (
        f"in {load_seconds}s from its server's start to Ready"
        in condition(ctx.llmd(), "ModelLoaded")["message"]
    ), status
    (server,) = pod.spec.containers
    assert (server.image, server.image_pull_policy) == (ctx.image, "IfNotPresent")
    table = _table(ctx, ctx.name)
    assert table == [HEADER, [ctx.name, DEMO_MODEL, "1", "1", "Ready"]], table

    with ctx.cluster.service_url(ctx.namespace, ctx.name, HTTP_PORT) as base:
        with openai_client(base) as ai:
            assert [m.id for m in ai.models.list()] == [MODEL]
        answer = chat(base)
        stream = stream_completion(base, "service", 64)
    (choice,) = answer.choices
    assert answer.usage is not None, answer
    tokens = answer.usage.completion_tokens
    assert (choice.finish_reason, tokens) == ("length", 8) or (
        choice.finish_reason == "stop" and 1 <= tokens <= 8
    ), answer
    assert stream.complete(64), stream
    exposition = _pod_metrics(ctx, pod)
    assert "vllm:num_requests_waiting" in exposition
    assert metric_sum(exposition, "vllm:request_success") == 2
    # The image's prebuilt CPU attention kernel, not the slow torch fallback.
    logs = ctx.kubectl("logs", pod.metadata.name)
    backend = next((ln.split("attention backend: ")[1] for ln in logs.splitlines()
                    if "attention backend: " in ln), None)  # fmt: skip
    assert backend == "cpu (cpu, requested auto)", logs[-3000:]
    # As many threads as the 500m CPU limit gives, not one per core of the node.
    threads = ("exec", pod.metadata.name, "--", "python", "-c",
               "import torch; print(torch.get_num_threads())")  # fmt: skip
    assert ctx.kubectl(*threads).strip() == "1"
    return (
        f"pod {pod.metadata.name} {pod.status.pod_ip}, model loaded in {load_seconds}s; "
        f"chat + 64-token stream; {backend}"
    )


def scaled_to_zero_reads_as_such(ctx: Context) -> str:
    """``kubectl scale --replicas=0``: phase ScaledToZero once no pod is left, in the columns of
    ``kubectl get llmd`` too; the conditions say why nothing serves."""
    wait_ready(ctx, 1)
    ctx.kubectl("scale", "llmd", ctx.name, "--replicas=0")

    def idle() -> dict[str, Any] | None:
        body = ctx.llmd()
        status = body.get("status") or {}
        settled = status.get("observedGeneration") == body["metadata"]["generation"]
        return (
            body if settled and status.get("phase") == "ScaledToZero" and not ctx.pods() else None
        )

    body = wait_for(idle, f"{ctx.name} ScaledToZero with no pod", READY_TIMEOUT)
    assert _conditions(body) == [
        ("Available", "False", "ScaledToZero", "0 replicas wanted"),
        ("Progressing", "False", "RolloutComplete", "0 replicas updated and ready"),
        ("Degraded", "False", "Reconciled", "the spec is reconciled"),
        ("ModelLoaded", "Unknown", "NoPods", "no pod runs the model"),
    ], body["status"]
    table = _table(ctx, ctx.name)
    assert table == [HEADER, [ctx.name, DEMO_MODEL, "0", "0", "ScaledToZero"]], table
    return f"kubectl get llmd: {' '.join(table[1])}; Available: False (ScaledToZero)"


UNRESOLVABLE_HUB = "http://hub.invalid"
"""The download's ``HF_ENDPOINT``: a reserved name that no resolver knows (RFC 6761), so the pod
meets a real name-resolution failure with no network at all."""
REPO = "org/name"


def failed_download_says_why(ctx: Context) -> str:
    """An ``hf://`` source whose hub cannot be resolved: the init container's termination
    message is the one line naming the cause, which ModelLoaded quotes and one Warning Event
    carries, across the init container's restarts."""
    fetch = dataclasses.replace(ctx, name=f"{ctx.name}-fetch")
    spec = {"model": {"source": f"hf://{REPO}"}, "replicas": 1,
            "resources": {"cpu": "500m", "memory": "1Gi"},
            "env": [{"name": "HF_ENDPOINT", "value": UNRESOLVABLE_HUB}]}  # fmt: skip
    body = {"apiVersion": "/".join(API[:2]), "kind": "LLMDeployment",
            "metadata": {"name": fetch.name}, "spec": spec}  # fmt: skip
    fetch.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    uid = fetch.llmd()["metadata"]["uid"]
    line = (
        f"cannot download {REPO} from {UNRESOLVABLE_HUB}: {ctx.name_resolution_error} "
        "(raised as LocalEntryNotFoundError)"
    )

    def expected(pod: V1Pod) -> str:
        (status,) = pod.status.init_container_statuses
        restarts = f", restarted {status.restart_count} times" if status.restart_count else ""
        return (
            f"1/1 pods failed to load; {pod.metadata.name}: container fetch-model exited with "
            f"code 1 (Error){restarts}: {line}"
        )

    def failed_again() -> tuple[V1Pod, dict[str, Any]] | None:
        """The pod, once its download failed at least twice, and the condition quoting it."""
        pods = fetch.pods()
        loaded = condition(fetch.llmd(), "ModelLoaded")
        if len(pods) != 1 or loaded is None or not pods[0].status.init_container_statuses:
            return None
        (pod,) = pods
        again = pod.status.init_container_statuses[0].restart_count >= 1
        return (pod, loaded) if again and loaded["message"] == expected(pod) else None

    pod, loaded = wait_for(failed_again, "the download to fail twice, quoted", READY_TIMEOUT)
    (status,) = pod.status.init_container_statuses
    ended = status.last_state.terminated or status.state.terminated
    assert (ended.exit_code, ended.reason, ended.message) == (1, "Error", line + "\n"), ended
    assert (loaded["status"], loaded["reason"]) == ("False", "DownloadFailed"), loaded
    first = (
        f"1/1 pods failed to load; {pod.metadata.name}: container fetch-model exited with code 1 "
        f"(Error): {line}"
    )
    assert _warnings(fetch, uid) == [("Warning", "DownloadFailed", first)], _warnings(fetch, uid)
    table = _table(fetch, fetch.name)
    assert table == [HEADER, [fetch.name, f"hf://{REPO}", "1", "0", "Progressing"]], table
    fetch.kubectl("delete", "llmd", fetch.name, "--wait=true", "--timeout=180s")
    wait_for(lambda: not fetch.pods(), f"the pods of {fetch.name} gone", 180)
    return (
        f"ModelLoaded False (DownloadFailed): {loaded['message']}; one Warning Event; "
        f"kubectl get llmd: {' '.join(table[1])}"
    )


def scale_to_two(ctx: Context) -> str:
    ctx.kubectl("scale", "llmd", ctx.name, "--replicas=2")
    pods = wait_ready(ctx, 2)
    for pod in pods:
        with ctx.cluster.pod_url(pod, HTTP_PORT) as base:
            assert chat(base).choices[0].finish_reason in ("stop", "length")
    before = _served(ctx, pods)
    with ctx.cluster.service_url(ctx.namespace, ctx.name, HTTP_PORT) as base:
        for _ in range(SPREAD_REQUESTS):
            assert chat(base).choices[0].finish_reason in ("stop", "length")
    after = _served(ctx, pods)
    spread = {name: after[name] - before[name] for name in after}
    assert sum(spread.values()) == SPREAD_REQUESTS, spread
    summary = f"{SPREAD_REQUESTS} requests through the Service served as {spread}"
    if ctx.cluster.access != "clusterip":
        return f"{summary} (a port-forward sticks to one pod: balance not checked)"
    assert all(n > 0 for n in spread.values()), f"one pod got every request: {spread}"
    return summary


POOL_GROUP, POOL_VERSION, POOLS = "inference.networking.k8s.io", "v1", "inferencepools"


def _pool_api(ctx: Context) -> bool:
    """Whether the cluster serves InferencePools. Just after its CRD is applied, discovery
    can fail for the group ("could not find the requested resource"): not served yet."""
    served = ctx.cluster.kubectl(
        "api-resources", f"--api-group={POOL_GROUP}", "-o", "name", check=False
    )
    return f"{POOLS}.{POOL_GROUP}" in served.split()


def _pool(ctx: Context) -> dict[str, Any] | None:
    found = ctx.cluster.custom.list_namespaced_custom_object(
        POOL_GROUP, POOL_VERSION, ctx.namespace, POOLS, label_selector=ctx.selector
    )["items"]
    return found[0] if found else None


def inference_pool_selects_ready_pods(ctx: Context) -> str:
    """A gateway's InferencePool: accepted, selecting exactly the Ready pods on the port they
    serve; gone with the spec's gateway (where the cluster has no such API: the condition)."""
    pods = wait_ready(ctx, 2)
    if not _pool_api(ctx) and ctx.inference_pool_crd is not None:
        ctx.cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(ctx.inference_pool_crd))
        wait_for(lambda: _pool_api(ctx), "the InferencePool API", 60)
    picker = {"name": f"{ctx.name}-epp", "port": 9002}
    gateway = json.dumps({"spec": {"gateway": {"inferencePool": {"endpointPickerRef": picker}}}})
    ctx.kubectl("patch", "llmd", ctx.name, "--type=merge", "-p", gateway)
    if not _pool_api(ctx):
        missing = wait_for(lambda: condition(ctx.llmd(), "InferencePool"), "the condition", 60)
        assert (missing["status"], missing["reason"]) == ("False", "InferencePoolAPIMissing")
        summary = "no InferencePool API in the cluster: InferencePool condition False"
    else:
        pool = wait_for(lambda: _pool(ctx), "the InferencePool", 60)
        (ref,) = pool["metadata"]["ownerReferences"]
        assert ref["uid"] == ctx.llmd()["metadata"]["uid"], ref
        labels = pool["spec"]["selector"]["matchLabels"]
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        listed = json.loads(ctx.kubectl("get", "pods", "-l", selector, "-o", "json"))["items"]
        selected = sorted(p["metadata"]["name"] for p in listed)
        ready = sorted(
            p["metadata"]["name"]
            for p in listed
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"]
            )
        )
        assert selected == ready == sorted(p.metadata.name for p in pods), (selected, ready)
        (target,) = pool["spec"]["targetPorts"]
        for pod in pods:
            served = [p.container_port for p in pod.spec.containers[0].ports]
            assert target["number"] in served, (target, served)
            with ctx.cluster.pod_url(pod, target["number"]) as base:
                status, body = http_get(f"{base}/v1/models")
                assert status == 200 and MODEL in body, (status, body[:200])
                status, body = http_get(f"{base}/metrics")
                assert status == 200 and "vllm:num_requests_waiting" in body, status
        applied = wait_for(lambda: condition(ctx.llmd(), "InferencePool"), "the condition", 60)
        assert (applied["status"], applied["reason"]) == ("True", "PoolApplied"), applied
        summary = (
            f"InferencePool {pool['metadata']['name']} selects {selected} (all Ready) "
            f"on port {target['number']}"
        )
    ctx.kubectl("patch", "llmd", ctx.name, "--type=json",
                "-p", '[{"op": "remove", "path": "/spec/gateway"}]')  # fmt: skip
    wait_for(lambda: condition(ctx.llmd(), "InferencePool") is None, "the condition gone", 60)
    if _pool_api(ctx):
        wait_for(lambda: _pool(ctx) is None, "the InferencePool gone", 60)
    assert sorted(p.metadata.name for p in wait_ready(ctx, 2, timeout=60)) == sorted(
        p.metadata.name for p in pods
    )
    return summary + "; removed with the spec's gateway, same pods"


KV_EVENTS_PORT = 5557
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _kv_event_topic(ctx: Context, pod: V1Pod) -> str | None:
    """The topic of the first KV-event message ``pod`` publishes while it serves requests."""
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 2000)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://{pod.status.pod_ip}:{KV_EVENTS_PORT}")
    try:
        for attempt in range(10):  # the first messages may go before the subscription is up
            with ctx.cluster.pod_url(pod, HTTP_PORT) as base:
                chat(
                    base,
                    content=f"{attempt}: tell me about the prefix cache of {pod.status.pod_ip}",
                )
            try:
                return sub.recv_multipart()[0].decode()
            except zmq.Again:
                continue
        return None
    finally:
        sub.close()


def kv_events_and_tool_calls(ctx: Context) -> str:
    """``engine.kvEvents`` and ``engine.toolCallParser`` on (kept for the later scenarios): after
    the rollout each pod publishes KV events on its ``kv-events`` port under the topic
    ``kv@<its name>@<model>`` (the downward API's POD_NAME), and answers tool_choice "auto"."""
    old = {p.metadata.name for p in wait_ready(ctx, 2)}
    engine = {"kvEvents": {"enabled": True}, "toolCallParser": "hermes"}
    ctx.kubectl(
        "patch", "llmd", ctx.name, "--type=merge", "-p", json.dumps({"spec": {"engine": engine}})
    )

    def rolled() -> bool:
        pods = ctx.pods()
        return (
            len(pods) == 2
            and all(_ready(p) for p in pods)
            and not old & {p.metadata.name for p in pods}
        )

    wait_for(rolled, "two new pods Ready", READY_TIMEOUT)
    pods = wait_ready(ctx, 2)
    for pod in pods:
        ports = {p.name: p.container_port for p in pod.spec.containers[0].ports}
        assert ports == {"http": HTTP_PORT, "kv-events": KV_EVENTS_PORT}, ports
        with ctx.cluster.pod_url(pod, HTTP_PORT) as base, openai_client(base) as ai:
            answer = ai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=8,
            )  # fmt: skip
        assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls"), answer
    if ctx.cluster.access != "clusterip":
        return "tool_choice auto answered (a port-forward carries no ZMQ: KV events not checked)"
    topics = {p.metadata.name: _kv_event_topic(ctx, p) for p in pods}
    assert topics == {name: f"kv@{name}@{MODEL}" for name in topics}, topics
    return f"tool_choice auto answered on both pods; KV events on :{KV_EVENTS_PORT} as {topics}"


def rollout_cuts_no_stream(ctx: Context) -> str:
    old = wait_ready(ctx, 2)
    traffic = RolloutTraffic(ctx.cluster, ctx.namespace, ctx.name, STREAM_TOKENS)
    patch = json.dumps({"spec": {"engine": {"maxNumSeqs": 6}}})
    traffic.run(lambda: ctx.kubectl("patch", "llmd", ctx.name, "--type=merge", "-p", patch),
                old, timeout=600)  # fmt: skip
    new = wait_ready(ctx, 2)
    assert not {p.metadata.name for p in new} & {p.metadata.name for p in old}
    for pod in new:
        args = pod.spec.containers[0].args
        assert args[args.index("--max-num-seqs") + 1] == "6", args

    admitted = [s for s in traffic.streams if s.admitted]
    cut = [s for s in admitted if not s.complete(STREAM_TOKENS)]
    assert not cut, cut
    refused_via_service = [s for s in traffic.streams if s.target == "service" and not s.admitted]
    assert not refused_via_service, refused_via_service
    carried = {p.metadata.name: traffic.in_flight_at_drain.get(p.metadata.name) for p in old}
    assert None not in carried.values(), f"a server never logged its drain: {carried}"
    assert all(carried.values()), f"no request was in flight when a pod began draining: {carried}"
    via_service = sum(1 for s in admitted if s.target == "service")
    return (
        f"{len(admitted)} streams of {STREAM_TOKENS} tokens complete, none cut "
        f"({via_service} via the Service, {len(admitted) - via_service} straight to the old pods); "
        f"in flight when drain began: {carried}"
    )


def deleted_pod_is_replaced(ctx: Context) -> str:
    pods = wait_ready(ctx, 2)
    victim = pods[0]
    answers: list[str | None] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set() and len(answers) < 500:
            with ctx.cluster.service_url(ctx.namespace, ctx.name, HTTP_PORT) as base:
                try:
                    answers.append(chat(base).choices[0].finish_reason)
                except Exception as e:
                    answers.append(f"{type(e).__name__}: {e}")

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        ctx.kubectl("delete", "pod", victim.metadata.name, "--wait=false")
        wait_for(
            lambda: victim.metadata.name not in {p.metadata.name for p in ctx.pods()},
            f"{victim.metadata.name} gone",
            READY_TIMEOUT,
        )
        now = wait_ready(ctx, 2)
    finally:
        stop.set()
        asker.join(timeout=150)
    failed = [a for a in answers if a not in ("stop", "length")]
    assert answers and not failed, failed
    names = sorted(p.metadata.name for p in now)
    assert pods[1].metadata.name in names and victim.metadata.name not in names, names
    return f"{victim.metadata.name} replaced; {len(answers)} requests through the Service, 0 failed"


def invalid_spec_keeps_serving(ctx: Context) -> str:
    before = sorted(p.metadata.name for p in wait_ready(ctx, 2))
    uid = ctx.llmd()["metadata"]["uid"]
    message = "autoscaling.minReplicas (3) is greater than autoscaling.maxReplicas (1)"

    def invalid(target: int) -> None:
        bounds = {"minReplicas": 3, "maxReplicas": 1, "targetWaitingRequests": target}
        patch = json.dumps({"spec": {"autoscaling": bounds}})
        ctx.kubectl("patch", "llmd", ctx.name, "--type=merge", "-p", patch)

    def reconciled() -> dict[str, Any] | None:
        body = ctx.llmd()
        observed = (body.get("status") or {}).get("observedGeneration")
        return body if observed == body["metadata"]["generation"] else None

    invalid(1)
    body = wait_for(reconciled, "the invalid spec reconciled", 60)
    degraded = condition(body, "Degraded")
    assert degraded is not None and degraded["status"] == "True", body["status"]
    assert (degraded["reason"], degraded["message"]) == ("InvalidSpec", message), degraded
    assert body["status"]["phase"] == "Degraded"
    wait_for(lambda: _warnings(ctx, uid), "the Warning Event", 60)
    # The same problem again (another edit, as a resync or a restart would meet it): no new Event.
    invalid(2)
    assert condition(wait_for(reconciled, "the second edit reconciled", 60), "Degraded") == degraded
    assert _warnings(ctx, uid) == [("Warning", "InvalidSpec", message)], _warnings(ctx, uid)
    with ctx.cluster.service_url(ctx.namespace, ctx.name, HTTP_PORT) as base:
        assert chat(base).choices[0].finish_reason in ("stop", "length")
    assert sorted(p.metadata.name for p in ctx.pods()) == before

    remove = '[{"op": "remove", "path": "/spec/autoscaling"}]'
    ctx.kubectl("patch", "llmd", ctx.name, "--type=json", "-p", remove)
    after = sorted(p.metadata.name for p in wait_ready(ctx, 2, timeout=60))
    assert condition(ctx.llmd(), "Degraded")["status"] == "False"
    assert after == before, (before, after)
    assert _warnings(ctx, uid) == [("Warning", "InvalidSpec", message)], _warnings(ctx, uid)
    return "Degraded/InvalidSpec, one Warning Event across two edits; same pods served; fixed"


def _answers(ctx: Context) -> bool:
    """The Service answers a chat completion (False while nothing is behind its ClusterIP)."""
    with ctx.cluster.service_url(ctx.namespace, ctx.name, HTTP_PORT) as base:
        try:
            return chat(base).choices[0].finish_reason in ("stop", "length")
        except APIConnectionError:
            return False


def _children(ctx: Context) -> dict[str, str]:
    """kind/name → uid of every Deployment, Service and PDB of the LLMDeployment."""
    found = json.loads(ctx.kubectl("get", "deployments,services,pdb", "-l", ctx.selector,
                                   "-o", "json"))["items"]  # fmt: skip
    return {f"{c['kind']}/{c['metadata']['name']}": c["metadata"]["uid"] for c in found}


def operator_restart_duplicates_nothing(ctx: Context) -> str:
    pods = sorted(p.metadata.name for p in wait_ready(ctx, 2))
    before = _children(ctx)
    assert sorted(before) == [f"{k}/{ctx.name}" for k in ("Deployment", "PodDisruptionBudget",
                                                          "Service")], before  # fmt: skip
    service = f"Service/{ctx.name}"
    ctx.kubectl("delete", "service", ctx.name)
    recreated = wait_for(
        lambda: (c := _children(ctx)).get(service, before[service]) != before[service] and c,
        "the Service re-created",
        60,
    )
    # A new Service has a new ClusterIP, which kube-proxy rejects until its endpoints are set.
    wait_for(lambda: _answers(ctx), "the re-created Service to answer", 60)

    (old,) = operator_pods(ctx)
    deployment = f"deployment/{ctx.operator}"
    ctx.cluster.kubectl("rollout", "restart", deployment, "-n", ctx.operator_namespace)
    ctx.cluster.kubectl("rollout", "status", deployment, "-n", ctx.operator_namespace,
                        "--timeout=180s")  # fmt: skip
    (new,) = wait_for(
        lambda: [p for p in operator_pods(ctx) if p.metadata.name != old.metadata.name
                 and _ready(p) and not p.metadata.deletion_timestamp],
        "the new operator pod",
        READY_TIMEOUT,
    )  # fmt: skip
    resumed = f"[{ctx.namespace}/{ctx.name}] Handler 'reconcile' succeeded"
    wait_for(lambda: resumed in operator_log(ctx, new), "the new operator to resume", 120)
    assert _children(ctx) == recreated, (recreated, _children(ctx))
    assert sorted(p.metadata.name for p in wait_ready(ctx, 2, timeout=60)) == pods
    return f"Service re-created; operator {new.metadata.name} resumed, same children and pods"


CHILD_KINDS = "pods,services,endpoints,endpointslices,deployments,replicasets,pdb,hpa"


def delete_leaves_nothing(ctx: Context) -> str:
    ctx.kubectl("delete", "llmd", ctx.name, "--wait=true", "--timeout=180s")
    wait_for(lambda: not ctx.kubectl("get", CHILD_KINDS, "-o", "name").strip(),
             f"every child of {ctx.name} collected", 180)  # fmt: skip
    assert not ctx.kubectl("get", "llmd", "-o", "name").strip()
    return f"no {CHILD_KINDS.replace(',', ', ')} left in {ctx.namespace}"


WORKERS = (
    "import os; print(sum(b'spawn_main' in open(f'/proc/{p}/cmdline', 'rb').read() "
    "for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()))"
)
"""Counts a pod's spawned worker processes (multiprocessing's ``spawn_main``), this counting
process (whose own command line names it) left out."""


def tensor_parallel_on_cpu(ctx: Context) -> str:
    """Two tensor-parallel ranks on a pod's CPUs: rank 1 a worker process beside the server,
    answering through the Service; deleted, nothing of it is left."""
    tp = dataclasses.replace(ctx, name=f"{ctx.name}-tp")
    spec = demo_spec() | {"engine": {"maxNumSeqs": 8, "tensorParallelSize": 2}}
    spec["resources"] = {"cpu": "1", "memory": "2Gi"}
    body = {"apiVersion": "/".join(API[:2]), "kind": "LLMDeployment",
            "metadata": {"name": tp.name}, "spec": spec}  # fmt: skip
    tp.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    (pod,) = wait_ready(tp, 1)
    (server,) = pod.spec.containers
    assert server.args[server.args.index("--tensor-parallel-size") + 1] == "2", server.args
    shm = next(v for v in pod.spec.volumes if v.name == "shm")
    assert shm.empty_dir.medium == "Memory" and shm.empty_dir.size_limit == "2Gi", shm
    workers = tp.kubectl("exec", pod.metadata.name, "--", "python", "-c", WORKERS).strip()
    assert workers == "1", workers
    with tp.cluster.service_url(tp.namespace, tp.name, HTTP_PORT) as base:
        answer = chat(base)
        stream = stream_completion(base, "tensor-parallel", 32)
    assert answer.choices[0].finish_reason in ("stop", "length"), answer
    assert stream.complete(32), stream
    tp.kubectl("delete", "llmd", tp.name, "--wait=true", "--timeout=180s")
    wait_for(lambda: not tp.kubectl("get", CHILD_KINDS, "-o", "name").strip(),
             f"every child of {tp.name} collected", 180)  # fmt: skip
    return f"pod {pod.metadata.name}: 2 ranks (1 worker process); chat + 32-token stream"


def real_model_answers(ctx: Context) -> str:
    """crds/samples/cpu-smollm2.yaml, the real model the image carries: a sensible answer
    through the Service (greedy), then deleted with its children."""
    real = dataclasses.replace(ctx, name=f"{ctx.name}-real")
    body = yaml.safe_load((ROOT / "crds" / "samples" / "cpu-smollm2.yaml").read_text())
    body["metadata"]["name"] = real.name
    body["spec"]["resources"] = {"cpu": "1", "memory": "3Gi"}  # the node's 2 cores are shared
    real.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    (pod,) = wait_ready(real, 1)
    served = body["spec"]["model"]["servedName"]
    url = real.cluster.service_url(real.namespace, real.name, HTTP_PORT)
    with url as base, openai_client(base) as ai:
        answer = ai.chat.completions.create(
            model=served,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=16,
        )
    content = answer.choices[0].message.content or ""
    assert "Paris" in content, answer
    real.kubectl("delete", "llmd", real.name, "--wait=true", "--timeout=180s")
    wait_for(lambda: not real.kubectl("get", CHILD_KINDS, "-o", "name").strip(),
             f"every child of {real.name} collected", 180)  # fmt: skip
    return f"pod {pod.metadata.name}: {served} answered {content!r}"


IMAGE_ADAPTERS = "/opt/kvserve/adapters"
"""The demo model's LoRA adapters that e2e/Dockerfile bakes (e2e/make_adapters.py)."""


def _adapters_loaded(ctx: Context, names: list[str]) -> dict[str, Any] | None:
    """The resource once its status, for the current generation, shows exactly ``names``
    Loaded and ``AdaptersReady`` True."""
    body = ctx.llmd()
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"]["generation"]:
        return None
    shown = [(a["name"], a["state"]) for a in status.get("adapters") or []]
    ready = condition(body, "AdaptersReady")
    loaded = shown == [(n, "Loaded") for n in names] and ready and ready["status"] == "True"
    return body if loaded else None


def _greedy_answers(ctx: Context, models: list[str], tries: int) -> dict[str, str]:
    """Each model's greedy answer through the Service, asked ``tries`` times on fresh
    connections (kube-proxy spreads them over the pods): every answer names the model asked
    for and is the same each time."""
    answers: dict[str, str] = {}
    with ctx.cluster.service_url(ctx.namespace, ctx.name, HTTP_PORT) as base:
        for model in models:
            seen = set()
            for _ in range(tries):
                with openai_client(base) as ai:
                    answer = ai.chat.completions.create(
                        model=model,
                        messages=[{"role": "user", "content": "Hello"}],
                        temperature=0,
                        max_tokens=8,
                    )
                assert answer.model == model, (model, answer)
                seen.add(answer.choices[0].message.content or "")
            assert len(seen) == 1, (model, seen)
            answers[model] = seen.pop()
    return answers


def adapters_load_without_restart(ctx: Context) -> str:
    """Two LoRA adapters (paths in the image) answer as each through the Service, unlike the
    model and each other; a third added to the spec reaches both running pods: no pod restarts
    or is replaced, the Deployment's template is unchanged."""
    lora = dataclasses.replace(ctx, name=f"{ctx.name}-lora")
    names = ["pirate", "poet"]
    spec = demo_spec(replicas=2)
    spec["adapters"] = [{"name": n, "source": f"{IMAGE_ADAPTERS}/{n}"} for n in names]
    body = {"apiVersion": "kvserve.io/v1alpha1", "kind": "LLMDeployment",
            "metadata": {"name": lora.name}, "spec": spec}  # fmt: skip
    lora.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    pods = wait_ready(lora, 2)
    wait_for(lambda: _adapters_loaded(lora, names), "two adapters loaded", 120)
    answers = _greedy_answers(lora, [MODEL, *names], tries=4)
    assert len(set(answers.values())) == 3, answers

    def deployment_generation() -> int:
        return lora.cluster.apps.read_namespaced_deployment(
            lora.name, lora.namespace
        ).metadata.generation

    before = {p.metadata.uid: p.status.container_statuses[0].restart_count for p in pods}
    generation = deployment_generation()
    names.append("sage")
    spec["adapters"].append({"name": "sage", "source": f"{IMAGE_ADAPTERS}/sage"})
    patch = json.dumps({"spec": {"adapters": spec["adapters"]}})
    lora.kubectl("patch", "llmd", lora.name, "--type=merge", "-p", patch)
    wait_for(lambda: _adapters_loaded(lora, names), "the third adapter loaded", 120)
    sage = _greedy_answers(lora, ["sage"], tries=4)["sage"]
    assert sage not in answers.values(), (sage, answers)
    after = {p.metadata.uid: p.status.container_statuses[0].restart_count for p in lora.pods()}
    assert after == before, (before, after)
    assert deployment_generation() == generation
    lora.kubectl("delete", "llmd", lora.name, "--wait=true", "--timeout=180s")
    wait_for(lambda: not lora.kubectl("get", CHILD_KINDS, "-o", "name").strip(),
             f"every child of {lora.name} collected", 180)  # fmt: skip
    return (
        f"pods {sorted(p.metadata.name for p in pods)}: {', '.join(names)} answer as each; "
        "sage loaded with no restart and no rollout"
    )


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Context], str]


SCENARIOS = [
    Scenario("operator-installed", install_operator),
    Scenario("demo-serves", serve_demo),
    Scenario("scaled-to-zero", scaled_to_zero_reads_as_such),
    Scenario("failed-download", failed_download_says_why),
    Scenario("scale-to-two", scale_to_two),
    Scenario("inference-pool", inference_pool_selects_ready_pods),
    Scenario("kv-events-and-tools", kv_events_and_tool_calls),
    Scenario("rollout-cuts-no-stream", rollout_cuts_no_stream),
    Scenario("deleted-pod-replaced", deleted_pod_is_replaced),
    Scenario("invalid-spec-degraded", invalid_spec_keeps_serving),
    Scenario("operator-restarted", operator_restart_duplicates_nothing),
    Scenario("delete-leaves-nothing", delete_leaves_nothing),
    Scenario("tensor-parallel-cpu", tensor_parallel_on_cpu),
    Scenario("real-model-answers", real_model_answers),
    Scenario("adapters-load-without-restart", adapters_load_without_restart),
]


def operator_pods(ctx: Context) -> list[V1Pod]:
    selector = f"app.kubernetes.io/instance={ctx.release},app.kubernetes.io/name=kvserve-operator"
    found = ctx.cluster.core.list_namespaced_pod(ctx.operator_namespace, label_selector=selector)
    return [p for p in found.items if p.metadata.labels.get("app.kubernetes.io/component") is None]


def operator_log(ctx: Context, pod: V1Pod) -> str:
    return ctx.cluster.kubectl("logs", "-n", ctx.operator_namespace, pod.metadata.name)


def check_operator_log(ctx: Context) -> None:
    """The operator's log since the last check holds no Forbidden answer and no traceback."""
    for pod in operator_pods(ctx):
        name = pod.metadata.name
        log = operator_log(ctx, pod)
        new = log[ctx.operator_log_checked.get(name, 0) :]
        ctx.operator_log_checked[name] = len(log)
        problems = [line for line in new.splitlines() if any(p in line for p in LOG_PROBLEMS)]
        assert not problems, "\n".join(problems[:20])


def diagnostics(ctx: Context, brief: bool = False) -> str:
    """What to read after a failure: objects, events, the operator's and the servers' logs.
    ``brief``: only the pods, the Warning events and the operator's last lines (its previous
    container's too, after a restart), short enough for the end of a CI log."""
    operator = ("logs", "-n", ctx.operator_namespace, f"deployment/{ctx.operator}")
    sections: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("objects", ("get", "llmd,all,pdb,hpa", "-A", "-o", "wide")),
        ("events", ("get", "events", "-A", "--sort-by=.lastTimestamp")),
        ("operator log", (*operator, "--tail=80")),
        ("server logs", ("logs", "-n", ctx.namespace, "-l", ctx.selector, "--prefix",
                         "--tail=40")),
    )  # fmt: skip
    if brief:
        sections = (
            ("pods", ("get", "pods", "-A", "-o", "wide")),
            ("warnings", ("get", "events", "-A", "--field-selector", "type=Warning",
                          "--sort-by=.lastTimestamp")),
            ("operator log", (*operator, "--tail=25")),
            ("operator's previous log", (*operator, "--previous", "--tail=15")),
        )  # fmt: skip
    parts = []
    for title, args in sections:
        try:
            parts.append(f"--- {title}\n{ctx.cluster.kubectl(*args, check=False)}")
        except Exception as e:  # diagnostics must not hide the failure they explain
            parts.append(f"--- {title}: {e}")
    return "\n".join(parts)


def run_scenario(ctx: Context, scenario: Scenario) -> float:
    """Run one scenario, check the operator's log, print its line; return its wall time."""
    started = time.monotonic()
    summary = scenario.run(ctx)
    check_operator_log(ctx)
    took = time.monotonic() - started
    print(f"ok  {scenario.name:<24} {took:6.1f}s  {summary}", flush=True)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--namespace", default="kvserve-e2e")
    parser.add_argument("--operator-namespace", default="kvserve-system")
    parser.add_argument("--release", default="kvs")
    parser.add_argument("--image", default="localhost/kvserve:dev")
    parser.add_argument("--pull-policy", default="IfNotPresent", choices=["IfNotPresent", "Never"])
    parser.add_argument("--access", default="clusterip", choices=["clusterip", "port-forward"])
    parser.add_argument("--kubeconfig", type=Path, default=None)
    parser.add_argument("--kubectl", default="kubectl", help="the kubectl binary")
    parser.add_argument("--helm", default="helm", help="the helm binary")
    parser.add_argument("--only", nargs="*", choices=[s.name for s in SCENARIOS], default=None)
    parser.add_argument(
        "--autoscaling",
        action="store_true",
        help="install the chart's own custom metrics API too and run the HPA scenario of "
        "e2e/autoscale.py last (the cluster needs the aggregation layer)",
    )
    args = parser.parse_args()
    access: Access = args.access
    scenarios = list(SCENARIOS)
    if args.autoscaling:
        from autoscale import autoscaling_scales_on_queue_depth  # it imports this module

        hpa = Scenario("autoscaling-on-queue-depth", autoscaling_scales_on_queue_depth)
        scenarios.append(hpa)
    wanted = {
        *(args.only or [s.name for s in scenarios]),
        *(["autoscaling-on-queue-depth"] if args.autoscaling else []),
    }
    ctx = Context(
        Cluster(args.kubeconfig, args.kubectl, args.helm, access=access),
        namespace=args.namespace,
        operator_namespace=args.operator_namespace,
        release=args.release,
        image=args.image,
        pull_policy=args.pull_policy,
        chart_values=() if args.autoscaling else Context.chart_values,
    )
    started = time.monotonic()
    for scenario in scenarios:
        if scenario.name in wanted:
            try:
                run_scenario(ctx, scenario)
            except BaseException:
                print(f"FAIL {scenario.name}\n{diagnostics(ctx)}", file=sys.stderr)
                raise
    print(f"all e2e scenarios passed in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
