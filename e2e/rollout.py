"""Long streams kept in flight while a Deployment rolls, to see whether any is cut.

Two kinds of bounded workers stream completions back to back:
- through the Service, from before the rollout starts until every old pod is gone: a client of
  the Service must never be refused or cut (the preStop sleep outlasts the endpoint removal);
- straight to each old pod, from the moment it is marked for deletion until it refuses a new
  stream (it drains after SIGTERM): streams admitted by a terminating pod must still finish.
A prober per old pod records when its ``/ready`` turns 503 (or its port closes), i.e. when its
drain began; a stream admitted before and ended after that instant was carried through it.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cluster import Cluster, wait_for
from kubernetes.client import V1Pod
from kubernetes.client.rest import ApiException
from traffic import Stream, http_get, stream_completion

HTTP_PORT = 8000
MAX_STREAMS_PER_WORKER = 60
POLL_SECONDS = 0.2


@dataclass
class RolloutTraffic:
    cluster: Cluster
    namespace: str
    service: str
    max_tokens: int
    service_workers: int = 2
    pod_workers: int = 2
    streams: list[Stream] = field(default_factory=list)
    drain_began: dict[str, float] = field(default_factory=dict)
    """Old pod name → when its ``/ready`` first answered anything but 200 after deletion."""
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

    def _to_pod(self, pod: V1Pod) -> None:
        with self.cluster.pod_url(pod, HTTP_PORT) as base:
            for _ in range(MAX_STREAMS_PER_WORKER):
                stream = stream_completion(base, pod.metadata.name, self.max_tokens)
                self._record(stream)
                if not stream.admitted:
                    return

    def _probe_drain(self, pod: V1Pod, deadline: float) -> None:
        """Draining: ``/ready`` answers 503, or nothing listens any more (a slow answer is not)."""
        with self.cluster.pod_url(pod, HTTP_PORT) as base:
            while time.monotonic() < deadline:
                status, body = http_get(f"{base}/ready", timeout=5)
                if status == 503 or (status == 0 and "Connection refused" in body):
                    with self._lock:
                        self.drain_began[pod.metadata.name] = time.monotonic()
                    return
                time.sleep(POLL_SECONDS)

    def _state(self, pod: V1Pod) -> str:
        """``gone``, ``terminating`` or ``running``."""
        try:
            live = self.cluster.core.read_namespaced_pod(pod.metadata.name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return "gone"
            raise
        if live.metadata.uid != pod.metadata.uid:
            return "gone"
        return "terminating" if live.metadata.deletion_timestamp else "running"

    def run(self, change: Callable[[], None], old_pods: list[V1Pod], timeout: float) -> None:
        """Stream through ``change()`` and the rollout it starts, until every old pod is gone."""
        stop = threading.Event()
        deadline = time.monotonic() + timeout
        for _ in range(self.service_workers):
            self._spawn(lambda: self._through_service(stop))
        wait_for(lambda: self.streams or None, "a first stream through the Service", 60)
        change()
        followed: set[str] = set()
        try:
            while len(followed) < len(old_pods) or any(self._state(p) != "gone" for p in old_pods):
                for pod in old_pods:
                    name = pod.metadata.name
                    if name not in followed and self._state(pod) != "running":
                        followed.add(name)
                        self._spawn(lambda p=pod: self._probe_drain(p, deadline))
                        for _ in range(self.pod_workers):
                            self._spawn(lambda p=pod: self._to_pod(p))
                if time.monotonic() > deadline:
                    raise AssertionError(f"old pods still there after {timeout:.0f}s")
                time.sleep(POLL_SECONDS)
        finally:
            stop.set()
            for thread in self._threads:
                thread.join(timeout=max(deadline - time.monotonic(), 30))
        if any(t.is_alive() for t in self._threads):
            raise AssertionError("a stream worker did not finish")
