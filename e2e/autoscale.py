"""Autoscaling on queue depth: the cluster's own HPA scales an LLMDeployment through kvserve's
custom metrics API (the operator chart's default), with nothing else installed.

The scenario, on any cluster where the chart is installed with ``metricsAPI.enabled=true``:
1. an LLMDeployment with ``autoscaling: {minReplicas: 1, maxReplicas: 3, targetWaitingRequests:
   1}``, ``maxNumSeqs: 2`` and a short scale-down stabilization; the custom metrics API answers
   one ``vllm_num_requests_waiting`` item per Ready pod and the HPA's status shows the metric;
2. ``load_workers`` clients stream completions of ``max_tokens`` tokens back to back through the
   Service (bounded by count and a deadline): requests queue beyond 2 per pod, the HPA raises
   the replicas, and the Deployment must reach 2 Ready pods within ``scale_up_timeout``;
3. the load stops gradually: all but ``tail_workers`` clients stop; those keep streaming through
   the Service while the HPA scales back to minReplicas, and each pod marked for deletion also
   gets streams of its own back to back until it refuses one (it drains after SIGTERM): the
   stream before that refusal was carried through the drain. Every admitted stream must end
   with all its tokens and ``finish_reason`` "length"; no stream through the Service may be
   refused.
The LLMDeployment is deleted at the end (left in place after a failure, to be inspected).
"""

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from cluster import wait_for
from kubernetes.client import V1Pod
from rollout import HTTP_PORT
from scenarios import API, Context, _ready, demo_spec, wait_ready
from traffic import Stream, stream_completion

from kvserve.operator.quantity import parse_quantity

METRIC = "vllm_num_requests_waiting"
METRICS_API = "/apis/custom.metrics.k8s.io/v1beta1"
MAX_STREAMS_PER_WORKER = 200
POLL_SECONDS = 0.5
METRICS_TIMEOUT = 90.0
"""The metrics API's first answer and the HPA's first status (one sync period, 15 s default)."""


@dataclass
class AutoscaleResult:
    load_started: float
    scaled_up: float
    """When the HPA first set the Deployment's replicas above 1."""
    second_ready: float
    """When the Deployment first had 2 Ready replicas."""
    load_stopped: float
    set_to_min: float
    """When the HPA set the replicas back to 1."""
    scaled_down: float
    """When the Deployment was back at minReplicas with every removed pod gone."""
    max_replicas_seen: int
    max_waiting_seen: float
    """The largest average ``vllm_num_requests_waiting`` the HPA's status showed."""
    removed: list[str]
    """Every pod the scale-down removed (Ready or still starting)."""
    streams: list[Stream]
    carried: dict[str, int]
    """Removed pod → streams admitted by it after it was marked for deletion."""
    refused_draining: int
    """Streams to removed pods refused once they drained (each such worker's last)."""

    def summary(self) -> str:
        via_service = sum(1 for s in self.streams if s.target == "service")
        return (
            f"load start → HPA scaled up {self.scaled_up - self.load_started:.1f}s → 2nd Ready pod "
            f"{self.second_ready - self.load_started:.1f}s (HPA: up to {self.max_replicas_seen} "
            f"replicas, waiting={self.max_waiting_seen:g}); load stop → HPA back to 1 "
            f"{self.set_to_min - self.load_stopped:.1f}s → removed pods gone "
            f"{self.scaled_down - self.load_stopped:.1f}s; {len(self.streams)} streams complete, "
            f"none cut ({via_service} via the Service, {len(self.streams) - via_service} to "
            f"removed pods {self.carried}; {self.refused_draining} refused by draining pods)"
        )


@dataclass
class _Traffic:
    ctx: Context
    max_tokens: int
    deadline: float
    streams: list[Stream] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _record(self, stream: Stream) -> Stream:
        with self.lock:
            self.streams.append(stream)
        return stream

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _through_service(self, stop: threading.Event) -> None:
        for _ in range(MAX_STREAMS_PER_WORKER):
            if stop.is_set() or time.monotonic() > self.deadline:
                return
            with self.ctx.cluster.service_url(self.ctx.namespace, self.ctx.name, HTTP_PORT) as url:
                self._record(stream_completion(url, "service", self.max_tokens))

    def _to_pod(self, pod: V1Pod) -> None:
        """Stream to a pod marked for deletion until it refuses (it drains) or the deadline."""
        with self.ctx.cluster.pod_url(pod, HTTP_PORT) as url:
            for _ in range(MAX_STREAMS_PER_WORKER):
                if time.monotonic() > self.deadline:
                    return
                if not self._record(
                    stream_completion(url, pod.metadata.name, self.max_tokens)
                ).admitted:
                    return

    def service_workers(self, count: int, stop: threading.Event) -> None:
        for _ in range(count):
            self._spawn(self._through_service, stop)

    def pod_worker(self, pod: V1Pod) -> None:
        self._spawn(self._to_pod, pod)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=max(self.deadline - time.monotonic(), 0) + 60)
        if any(t.is_alive() for t in self.threads):
            raise AssertionError("a stream worker did not finish")


def _hpa_resource(ctx: Context) -> str:
    """The HPA in the newest version with per-pod metric status (autoscaling/v1 has none)."""
    versions = ctx.cluster.kubectl("api-versions").split()
    version = "v2" if "autoscaling/v2" in versions else "v2beta2"
    return f"horizontalpodautoscalers.{version}.autoscaling"


def _hpa_waiting(ctx: Context, resource: str) -> tuple[float | None, int]:
    """(average waiting requests per pod in the HPA's status or None, desired replicas)."""
    hpa = json.loads(ctx.kubectl("get", resource, ctx.name, "-o", "json"))
    status = hpa.get("status") or {}
    for current in status.get("currentMetrics") or []:
        if current.get("type") == "Pods" and current["pods"]["metric"]["name"] == METRIC:
            average = current["pods"]["current"]["averageValue"]
            return float(parse_quantity(average)), status.get("desiredReplicas", 0)
    return None, status.get("desiredReplicas", 0)


def metric_items(ctx: Context) -> list[dict[str, Any]]:
    """The metrics API's ``vllm_num_requests_waiting`` of every pod in the namespace."""
    path = f"{METRICS_API}/namespaces/{ctx.namespace}/pods/*/{METRIC}"
    answer = json.loads(ctx.cluster.kubectl("get", "--raw", path))
    assert (answer["kind"], answer["apiVersion"]) == (
        "MetricValueList", "custom.metrics.k8s.io/v1beta1",
    ), answer  # fmt: skip
    return answer["items"]


def _answers_for(ctx: Context, pods: list[V1Pod]) -> list[dict[str, Any]] | None:
    """The metrics API's items, if they are exactly one per pod of ``pods``."""
    items = metric_items(ctx)
    names = sorted(i["describedObject"]["name"] for i in items)
    return items if names == sorted(p.metadata.name for p in pods) else None


def _live(ctx: Context) -> tuple[list[V1Pod], list[V1Pod]]:
    """(pods not marked for deletion, pods marked for deletion)."""
    pods = ctx.pods()
    return (
        [p for p in pods if not p.metadata.deletion_timestamp],
        [p for p in pods if p.metadata.deletion_timestamp],
    )


def _ready_replicas(ctx: Context) -> tuple[int, int]:
    """The Deployment's (spec.replicas, status.readyReplicas)."""
    deployment = ctx.cluster.apps.read_namespaced_deployment(ctx.name, ctx.namespace)
    return deployment.spec.replicas or 0, deployment.status.ready_replicas or 0


def run_autoscaling(
    ctx: Context,
    *,
    max_tokens: int = 600,
    load_workers: int = 8,
    tail_workers: int = 2,
    stabilization_seconds: int = 15,
    scale_up_timeout: float = 120.0,
    scale_down_timeout: float = 150.0,
) -> AutoscaleResult:
    """Scale ``ctx.name`` up under load and back down after it; see the module docstring."""
    spec = demo_spec(max_num_seqs=2)
    spec["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "targetWaitingRequests": 1,
        "scaleDownStabilizationSeconds": stabilization_seconds,
    }
    body = {"apiVersion": "/".join(API[:2]), "kind": "LLMDeployment",
            "metadata": {"name": ctx.name}, "spec": spec}  # fmt: skip
    ctx.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    (pod,) = wait_ready(ctx, 1)
    items = wait_for(lambda: _answers_for(ctx, [pod]), "the metrics API's item", METRICS_TIMEOUT)
    shown = [(i["describedObject"]["kind"], i["describedObject"]["namespace"], i["metricName"])
             for i in items]  # fmt: skip
    assert shown == [("Pod", ctx.namespace, METRIC)] and items[0]["value"] == "0", items
    resource = _hpa_resource(ctx)
    idle = wait_for(lambda: (h := _hpa_waiting(ctx, resource))[0] is not None and h,
                    "the HPA's status to show the metric", METRICS_TIMEOUT)  # fmt: skip
    assert idle == (0.0, 1), idle

    traffic = _Traffic(ctx, max_tokens, time.monotonic() + scale_up_timeout + scale_down_timeout)
    load_stop, tail_stop = threading.Event(), threading.Event()
    load_started = time.monotonic()
    traffic.service_workers(tail_workers, tail_stop)
    traffic.service_workers(load_workers - tail_workers, load_stop)
    max_waiting, max_replicas = 0.0, 1
    scaled_up = set_to_min = 0.0
    followed: dict[str, float] = {}
    """Pod marked for deletion → when that was seen; ``served``: those that were Ready then."""
    served: set[str] = set()
    try:
        deadline = load_started + scale_up_timeout
        while (replicas := _ready_replicas(ctx))[1] < 2:
            if replicas[0] >= 2 and not scaled_up:
                scaled_up = time.monotonic()
            waiting, desired = _hpa_waiting(ctx, resource)
            max_waiting, max_replicas = max(max_waiting, waiting or 0), max(max_replicas, desired)
            if time.monotonic() > deadline:
                hpa = f"HPA: waiting={waiting}, desired={desired}"
                raise AssertionError(f"{replicas} after {scale_up_timeout:.0f}s of load ({hpa})")
            time.sleep(POLL_SECONDS)
        second_ready = time.monotonic()
        scaled_up = scaled_up or second_ready
        print(f"load start → 2nd Ready pod: {second_ready - load_started:.1f}s", flush=True)
        ready = [p for p in _live(ctx)[0] if _ready(p)]
        wait_for(lambda: _answers_for(ctx, [p for p in _live(ctx)[0] if _ready(p)]),
                 f"one metrics API item per Ready pod ({len(ready)})", 30)  # fmt: skip
        waiting, desired = _hpa_waiting(ctx, resource)
        max_waiting, max_replicas = max(max_waiting, waiting or 0), max(max_replicas, desired)

        load_stop.set()
        load_stopped = time.monotonic()
        deadline = load_stopped + scale_down_timeout
        while True:
            live, leaving = _live(ctx)
            replicas = _ready_replicas(ctx)
            if replicas[0] == 1 and not set_to_min:
                set_to_min = time.monotonic()
            for pod in leaving:
                if pod.metadata.name not in followed:
                    followed[pod.metadata.name] = time.monotonic()
                    if _ready(pod):
                        served.add(pod.metadata.name)
                        traffic.pod_worker(pod)
            if not leaving and len(live) == 1 and replicas == (1, 1):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"not back to 1 pod {scale_down_timeout:.0f}s after the load "
                                     f"(live {len(live)}, leaving {len(leaving)})")  # fmt: skip
            time.sleep(POLL_SECONDS)
        scaled_down = time.monotonic()
        print(f"load stop → back to 1 pod: {scaled_down - load_stopped:.1f}s", flush=True)
    finally:
        load_stop.set()
        tail_stop.set()
        traffic.join()

    assert max_waiting >= 1, f"the HPA's status never showed a waiting request: {max_waiting}"
    via_service = [s for s in traffic.streams if s.target == "service"]
    refused = [s for s in via_service if not s.admitted]
    assert not refused, refused
    admitted = [s for s in traffic.streams if s.admitted]
    cut = [s for s in admitted if not s.complete(max_tokens)]
    assert not cut, cut
    carried = {name: sum(1 for s in admitted if s.target == name) for name in sorted(served)}
    assert served and all(carried.values()), f"a Ready removed pod admitted no stream: {carried}"
    for name in served:
        # Its worker streamed back to back until a refusal (the server drains after SIGTERM):
        # the stream before it was admitted before SIGTERM and ended after it, complete.
        last = [s for s in traffic.streams if s.target == name][-2:]
        assert len(last) == 2 and last[0].admitted and not last[1].admitted, (name, last)
    in_flight = [s for s in via_service if any(s.started < t < s.ended for t in followed.values())]
    assert in_flight, "no stream through the Service was in flight when the pods were removed"
    # Gone before anything else is torn down: an operator still running would re-create it.
    ctx.kubectl("delete", "llmd", ctx.name, "--wait=true", "--timeout=120s")
    return AutoscaleResult(
        load_started, scaled_up, second_ready, load_stopped, set_to_min, scaled_down,
        max_replicas, max_waiting, sorted(followed), admitted, carried,
        sum(1 for s in traffic.streams if s.target != "service" and not s.admitted),
    )  # fmt: skip


def autoscaling_scales_on_queue_depth(ctx: Context) -> str:
    """The scenario's one-line summary (the ``Scenario.run`` shape of e2e/scenarios.py)."""
    return run_autoscaling(ctx).summary()
