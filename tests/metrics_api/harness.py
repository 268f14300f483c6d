"""Serving pods and the metrics API on loopback, over real HTTP and TLS, for the tests.

A ``PodServer`` is an aiohttp server answering ``/metrics`` as a kvserve pod does (the real
``ServerMetrics`` exposition) or as a broken one does (garbage, an error, too slow); its pod
manifest is what the API server would list for it, with ``podIP`` 127.0.0.1 and its port.
"""

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from kvserve.engine.core.scheduler import SchedulerStats
from kvserve.operator.metrics_api.app import make_app
from kvserve.operator.metrics_api.auth import Authorizer, RequestHeaderConfig, server_ssl_context
from kvserve.operator.resource import labels
from kvserve.server.metrics import ServerMetrics
from metrics_api.certs import KeyPair, make_ca, make_cert

FRONT_PROXY_CN = "front-proxy-client"


def exposition(waiting: int, running: int, kv_usage: float, model: str = "m") -> str:
    metrics = ServerMetrics(model)
    metrics.on_step(SchedulerStats(running, waiting, kv_usage), [])
    metrics.snapshot.rebuild()
    return metrics.exposition().decode()


@dataclass
class PodServer:
    """One pod's ``/metrics``: ``body`` with ``status`` after ``delay`` seconds."""

    body: str = ""
    status: int = 200
    delay: float = 0.0
    hits: int = 0
    port: int = 0

    async def _metrics(self, _: web.Request) -> web.Response:
        self.hits += 1
        await asyncio.sleep(self.delay)
        return web.Response(text=self.body, status=self.status)

    @asynccontextmanager
    async def running(self) -> AsyncIterator["PodServer"]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        try:
            yield self
        finally:
            await runner.cleanup()


def pod_manifest(
    name: str,
    port: int,
    llmd: str = "demo",
    namespace: str = "ml",
    ready: bool = True,
    phase: str = "Running",
    ip: str | None = "127.0.0.1",
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "labels": labels(llmd),
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    ports = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    spec = {"containers": [{"name": "server", "ports": ports}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


@dataclass
class Cluster:
    """What the API server would answer: pods per (namespace, selector); reviews it decides."""

    pods: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    allowed_users: set[str] = field(default_factory=lambda: {"system:kube-aggregator"})
    listed: list[tuple[str, str]] = field(default_factory=list)
    reviews: list[dict[str, Any]] = field(default_factory=list)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.listed.append((namespace, selector))
        if "!!" in selector:
            raise LookupError(f"unable to parse requirement: {selector}")
        return self.pods.get((namespace, selector), [])

    async def review(self, review: dict[str, Any]) -> dict[str, Any]:
        self.reviews.append(review)
        allowed = review["spec"]["user"] in self.allowed_users
        reason = "" if allowed else "no RBAC policy matched"
        return {**review, "status": {"allowed": allowed, "reason": reason}}


@dataclass(frozen=True)
class Pki:
    requestheader_ca: KeyPair
    front_proxy: KeyPair
    unlisted_client: KeyPair
    """Signed by the requestheader CA, with a CN that is not an allowed name."""
    foreign_client: KeyPair
    """The front proxy's CN, signed by another CA."""
    serving_ca: KeyPair
    serving: KeyPair

    def config(self) -> RequestHeaderConfig:
        return RequestHeaderConfig(
            client_ca=self.requestheader_ca.cert.read_text(), allowed_names=(FRONT_PROXY_CN,)
        )

    def client_context(self, client: KeyPair | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.serving_ca.cert))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))
        return context


@dataclass
class MetricsApi:
    url: str
    session: aiohttp.ClientSession
    pki: Pki

    async def get(
        self,
        path: str,
        client: KeyPair | None = None,
        user: str | None = "system:kube-aggregator",
        groups: tuple[str, ...] = ("system:masters", "system:authenticated"),
        headers: dict[str, str] | None = None,
        **params: str,
    ) -> tuple[int, Any]:
        """(status, JSON body) of GET ``path`` as the front proxy (or ``client``) sends it."""
        sent: list[tuple[str, str]] = list((headers or {}).items())
        if user is not None:
            sent.append(("X-Remote-User", user))
        sent += [("X-Remote-Group", g) for g in groups]
        context = self.pki.client_context(client or self.pki.front_proxy)
        async with self.session.get(
            self.url + path, params=params, headers=sent, ssl=context
        ) as response:
            body = await response.json() if response.content_type == "application/json" else None
            return response.status, body

    async def get_without_certificate(self, path: str) -> tuple[int, Any]:
        context = self.pki.client_context(None)
        async with self.session.get(self.url + path, ssl=context) as response:
            return response.status, await response.json()


@asynccontextmanager
async def metrics_api(
    pki: Pki, cluster: Cluster, clock: Callable[[], float], scrape_timeout: float = 0.5
) -> AsyncIterator[MetricsApi]:
    """The API on 127.0.0.1 over TLS, its samples reused for 5 s on ``clock``."""
    authorizer = Authorizer(cluster.review, ttl=10.0, clock=clock)
    app = make_app(pki.config(), authorizer, cluster.list_pods, scrape_timeout, 5.0, clock)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    tls = server_ssl_context(str(pki.serving.cert), str(pki.serving.key), pki.config())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:
            yield MetricsApi(f"https://127.0.0.1:{port}", session, pki)
    finally:
        await runner.cleanup()


def make_pki(directory: Path) -> Pki:
    requestheader_ca = make_ca(directory, "requestheader-ca")
    other = directory / "other"
    other.mkdir()
    serving_ca = make_ca(directory, "serving-ca")
    return Pki(
        requestheader_ca=requestheader_ca,
        front_proxy=make_cert(directory, requestheader_ca, FRONT_PROXY_CN, "clientAuth"),
        unlisted_client=make_cert(directory, requestheader_ca, "someone-else", "clientAuth"),
        foreign_client=make_cert(other, make_ca(other, "other-ca"), FRONT_PROXY_CN, "clientAuth"),
        serving_ca=serving_ca,
        serving=make_cert(
            directory, serving_ca, "metrics-api", "serverAuth", "IP:127.0.0.1,DNS:localhost"
        ),
    )
