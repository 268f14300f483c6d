"""Authentication and authorisation as an aggregated API server must do them.

Only the kube-apiserver's front proxy may call: TLS asks every client for a certificate and
accepts only those signed by the requestheader CA (a certificate from any other CA fails the
handshake); a request without one, or whose certificate's common name is not an allowed name,
is refused with 401. The user and groups the front proxy asserts in its headers
(``X-Remote-User``, ``X-Remote-Group``, ``X-Remote-Extra-*``, names as the apiserver
publishes them) are then authorised with a SubjectAccessReview; a denial is 403. All of this
comes from ``kube-system/extension-apiserver-authentication``, read at start.
"""

import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from aiohttp import web

AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")


class Unauthenticated(Exception):
    """The caller is not the front proxy, or did not say who the user is."""


@dataclass(frozen=True)
class RequestHeaderConfig:
    client_ca: str
    """PEM bundle of the CA(s) that sign the front proxy's client certificate."""
    allowed_names: tuple[str, ...] = ()
    """Common names the front proxy's certificate may carry; empty means any."""
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @classmethod
    def from_configmap(cls, data: dict[str, str]) -> "RequestHeaderConfig":
        """From the ConfigMap's data; ValueError when the aggregation layer is not set up."""
        ca = data.get("requestheader-client-ca-file")
        if not ca:
            raise ValueError(
                f"{'/'.join(AUTH_CONFIGMAP)} has no requestheader-client-ca-file: "
                "kube-apiserver runs without --requestheader-client-ca-file "
                "(the aggregation layer is not configured)"
            )

        def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(json.loads(data[key])) if data.get(key) else default

        return cls(
            client_ca=ca,
            allowed_names=names("requestheader-allowed-names", ()),
            username_headers=names("requestheader-username-headers", cls.username_headers),
            group_headers=names("requestheader-group-headers", cls.group_headers),
            extra_prefixes=names("requestheader-extra-headers-prefix", cls.extra_prefixes),
        )


def server_ssl_context(
    cert_file: str, key_file: str, config: RequestHeaderConfig
) -> ssl.SSLContext:
    """Serving certificate, and client certificates verified against the requestheader CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.load_verify_locations(cadata=config.client_ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


@dataclass(frozen=True)
class UserInfo:
    name: str
    groups: tuple[str, ...] = ()
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _common_name(peercert: dict[str, Any]) -> str | None:
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None


def authenticate(request: web.Request, config: RequestHeaderConfig) -> UserInfo:
    """The user the front proxy asserts; Unauthenticated unless the caller is the front proxy."""
    peercert = request.transport.get_extra_info("peercert") if request.transport else None
    if not peercert:
        raise Unauthenticated("a client certificate signed by the requestheader CA is required")
    name = _common_name(peercert)
    if config.allowed_names and name not in config.allowed_names:
        raise Unauthenticated(f"client certificate CN {name!r} is not an allowed front proxy")
    user = next((request.headers[h] for h in config.username_headers if request.headers.get(h)), "")
    if not user:
        raise Unauthenticated("the front proxy named no user")
    groups = tuple(g for h in config.group_headers for g in request.headers.getall(h, ()))
    extra: dict[str, tuple[str, ...]] = {}
    for header in request.headers:
        for prefix in config.extra_prefixes:
            if header.lower().startswith(prefix.lower()) and len(header) > len(prefix):
                key = unquote(header[len(prefix) :]).lower()
                extra[key] = tuple(request.headers.getall(header))
    return UserInfo(user, groups, extra)


Review = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""Creates a SubjectAccessReview and returns the API server's answer."""


class Authorizer:
    """SubjectAccessReviews, each decision cached for ``ttl`` seconds, as kube delegation does."""

    def __init__(
        self, review: Review, ttl: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.review = review
        self.ttl = ttl
        self.clock = clock
        self._decisions: dict[str, tuple[float, bool, str]] = {}

    async def allowed(self, user: UserInfo, attributes: dict[str, Any]) -> tuple[bool, str]:
        """(allowed, reason) for ``user`` doing what ``attributes`` describe."""
        spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups)}
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra.items()}
        kind = "nonResourceAttributes" if "path" in attributes else "resourceAttributes"
        spec[kind] = attributes
        key = json.dumps(spec, sort_keys=True)
        now = self.clock()
        cached = self._decisions.get(key)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1], cached[2]
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview"}
        answer = await self.review({**body, "spec": spec})
        status = answer.get("status") or {}
        decision = bool(status.get("allowed")), status.get("reason", "")
        for stale in [k for k, (at, _, _) in self._decisions.items() if now - at >= self.ttl]:
            del self._decisions[stale]
        self._decisions[key] = (now, *decision)
        return decision
