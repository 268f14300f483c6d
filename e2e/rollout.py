"""Long streams kept in flight while a Deployment rolls, to see whether any is cut.

Two kinds of bounded workers stream completions back to back, from before the change:
- through the Service until every old pod is gone: a client of the Service must never be
  refused or cut (the preStop sleep outlasts the endpoint removal);
- straight to each old pod until it refuses a new stream (it drains after SIGTERM), two per
  pod a second apart, so that one of them is always in flight: streams admitted by a pod
  that then terminates must still finish.
A follower per old pod reads its server's log to the end: the server logs how many requests
it had in flight when its drain began (``draining N requests``), its own count, free of any
client's timing.
"""

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cluster import Cluster, wait_for
from kubernetes.client import V1Pod
from kubernetes.client.rest import ApiException
from traffic import Stream, stream_completion

HTTP_PORT = 8000
MAX_STREAMS_PER_WORKER = 60
POLL_SECONDS = 0.2
STAGGER_SECONDS = 1.0
"""How far apart the workers of one old pod start, so that their streams do not end together."""
_DRAINING = re.compile(r"draining (\d+) requests")


@dataclass
class RolloutTraffic:
    cluster: Cluster
    namespace: str
    service: str
    max_tokens: int
    service_workers: int = 2
    pod_workers: int = 2
    streams: list[Stream] = field(default_factory=list)
    in_flight_at_drain: dict[str, int] = field(default_factory=dict)
    """Old pod name → the requests its server had in flight when its drain began (its log)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _spawn(self, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _record(self, stream: Stream) -> None:
        with self._lock:
            self.streams.append(stream)

    def _through_service(self, stop: threading.Event) -> None:
        for _ in range(MAX_STREAMS_PER_WORKER):
            if stop.is_set():
                return
            with self.cluster.service_url(self.namespace, self.service, HTTP_PORT) as base:
                self._record(stream_completion(base, "service", self.max_tokens))

    def _to_pod(self, pod: V1Pod, delay: float, deadline: float) -> None:
        time.sleep(delay)
        with self.cluster.pod_url(pod, HTTP_PORT) as base:
            while time.monotonic() < deadline:
                stream = stream_completion(base, pod.metadata.name, self.max_tokens)
                self._record(stream)
                if not stream.admitted:
                    return

    def _follow_log(self, pod: V1Pod, deadline: float) -> None:
        """Read the server's log until its container exits; note its drain's in-flight count."""
        log = self.cluster.kubectl(
            "logs", "-f", "-n", self.namespace, pod.metadata.name,
            check=False, timeout=max(deadline - time.monotonic(), 1),
        )  # fmt: skip
        found = _DRAINING.search(log)
        if found:
            with self._lock:
                self.in_flight_at_drain[pod.metadata.name] = int(found.group(1))

    def _gone(self, pod: V1Pod) -> bool:
        """No pod of that name, or one of that name that is another pod (another uid)."""
        try:
            live = self.cluster.core.read_namespaced_pod(pod.metadata.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return live.metadata.uid != pod.metadata.uid

    def run(self, change: Callable[[], None], old_pods: list[V1Pod], timeout: float) -> None:
        """Stream through ``change()`` and the rollout it starts, until every old pod is gone."""
        stop = threading.Event()
        deadline = time.monotonic() + timeout
        for pod in old_pods:
            self._spawn(lambda p=pod: self._follow_log(p, deadline))
            for k in range(self.pod_workers):
                self._spawn(lambda p=pod, k=k: self._to_pod(p, k * STAGGER_SECONDS, deadline))
        for _ in range(self.service_workers):
            self._spawn(lambda: self._through_service(stop))
        wait_for(lambda: self.streams or None, "a first stream", 60)
        change()
        try:
            while not all(self._gone(p) for p in old_pods):
                if time.monotonic() > deadline:
                    raise AssertionError(f"old pods still there after {timeout:.0f}s")
                time.sleep(POLL_SECONDS)
        finally:
            stop.set()
            for thread in self._threads:
                thread.join(timeout=max(deadline - time.monotonic(), 30))
        if any(t.is_alive() for t in self._threads):
            raise AssertionError("a stream worker did not finish")
