"""Per-pod values read from the pods' own ``/metrics``, concurrently, with a short-lived cache.

A value is never invented: a pod that is not Ready, does not answer within the timeout,
answers with an error or with text that is not the Prometheus exposition format is left out of
the answer (the HPA then treats it as missing, never as 0). A sample is reused for ``max_age``
seconds, so the HPA's polls (every 15 s, one request per metric) cost each pod one scrape;
once older it is never served again: the pod is scraped anew, and left out if that fails.
"""

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvserve.operator.metrics_api.catalog import SERVED_METRICS
from kvserve.operator.resource import HTTP_PORT

MAX_EXPOSITION_BYTES = 4 << 20
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodTarget:
    namespace: str
    name: str
    uid: str
    url: str


@dataclass(frozen=True)
class Sample:
    values: dict[str, float]
    """Served metric name → the pod's value; a metric the pod does not export is absent."""
    timestamp: datetime
    taken: float
    """When it was read, on the scraper's clock."""


def _is_ready(status: dict[str, Any]) -> bool:
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _metrics_port(pod_spec: dict[str, Any]) -> int:
    """The container port named ``http`` (the server's one port), else the default."""
    for container in pod_spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http":
                return int(port["containerPort"])
    return HTTP_PORT


def ready_targets(pods: Iterable[dict[str, Any]]) -> list[PodTarget]:
    """The pods to scrape: Running, Ready, not being deleted, with an IP; in the given order."""
    targets = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        ip = status.get("podIP")
        if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not ip:
            continue
        if not _is_ready(status):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{_metrics_port(pod.get('spec') or {})}/metrics"
        targets.append(PodTarget(meta["namespace"], meta["name"], meta["uid"], url))
    return targets


def parse_exposition(text: str) -> dict[str, float]:
    """Served metric name → value; ValueError when ``text`` is not the exposition format."""
    wanted = {m.exposition: m for m in SERVED_METRICS.values()}
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        metric = wanted.get(family.name)
        if metric is None:
            continue
        samples = [s.value for s in family.samples if s.name == family.name]
        found.setdefault(metric.name, []).extend(v for v in samples if math.isfinite(v))
    return {name: float(SERVED_METRICS[name].combine(v)) for name, v in found.items() if v}


class Scraper:
    """Reads pods' ``/metrics``: one scrape per pod per ``max_age``, shared by all callers."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        timeout: float = 2.0,
        max_age: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.max_age = max_age
        self.clock = clock
        self._latest: dict[PodTarget, tuple[float, Sample | None]] = {}
        self._inflight: dict[PodTarget, asyncio.Task[Sample | None]] = {}

    async def samples(self, targets: list[PodTarget]) -> dict[PodTarget, Sample]:
        """The fresh sample of each target that has one; failed targets are absent."""
        now = self.clock()
        for target in [t for t, (at, _) in self._latest.items() if now - at >= self.max_age]:
            del self._latest[target]
        found = await asyncio.gather(*(self._sample(t) for t in targets))
        return {t: s for t, s in zip(targets, found, strict=True) if s is not None}

    async def _sample(self, target: PodTarget) -> Sample | None:
        if target in self._latest:
            return self._latest[target][1]
        task = self._inflight.get(target)
        if task is None:
            task = asyncio.create_task(self._scrape(target))
            self._inflight[target] = task
            task.add_done_callback(lambda _: self._inflight.pop(target, None))
        return await asyncio.shield(task)

    async def _scrape(self, target: PodTarget) -> Sample | None:
        started = self.clock()
        sample = None
        try:
            async with self.session.get(target.url, timeout=self.timeout) as response:
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}")
                body = await response.content.read(MAX_EXPOSITION_BYTES + 1)
            if len(body) > MAX_EXPOSITION_BYTES:
                raise ValueError(f"more than {MAX_EXPOSITION_BYTES} bytes")
            values = parse_exposition(body.decode())
            sample = Sample(values, datetime.now(UTC), started)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            log.warning("pod %s/%s left out: %s: %s", target.namespace, target.name, target.url, e)
        self._latest[target] = (started, sample)
        return sample
