"""Which server answers the HPA's custom metrics: the ``custom.metrics.k8s.io`` APIServices.

The chart installs kvserve's own metrics API (``metrics_api``) unless another server
(prometheus-adapter, KEDA's, ...) already holds an APIService of the group; it never overwrites
one it does not own. The operator, told by the chart which Service is kvserve's
(``KVSERVE_METRICS_API_SERVICE``, set while ``metricsAPI.enabled``), reports on each
LLMDeployment an HPA scales whether the HPA can read its metrics from it (the ``CustomMetrics``
condition) and logs each change of that verdict once.
"""

import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from kvserve.operator.metrics_api.answers import GROUP, VERSIONS

METRICS_API_ENV = "KVSERVE_METRICS_API_SERVICE"
"""``<namespace>/<name>`` of kvserve's metrics API Service; unset: not kvserve's business."""
APISERVICES = tuple(f"{version}.{GROUP}" for version in VERSIONS)
CONDITION = "CustomMetrics"

Verdict = tuple[bool, str, str]
"""(the HPA reads kvserve's metrics API, reason, message): the ``CustomMetrics`` condition."""
log = logging.getLogger(__name__)


def _served_by(apiservice: dict[str, Any]) -> str:
    service = apiservice["spec"].get("service") or {}
    return f"{service.get('namespace', '')}/{service.get('name', '')}" if service else "local"


def verdict(apiservices: dict[str, dict[str, Any] | None], ours: str) -> Verdict:
    """From the APIServices by name (None: absent) and kvserve's Service ``ours``."""
    present = {name: a for name, a in apiservices.items() if a is not None}
    foreign = {name: _served_by(a) for name, a in present.items() if _served_by(a) != ours}
    if foreign:
        held = ", ".join(f"APIService {name} (service {by})" for name, by in foreign.items())
        return (
            False,
            "MetricsAPIConflict",
            f"{GROUP} is served by {held}, not by kvserve's metrics API ({ours}); it was left "
            "as it is and the HPA reads its metrics from it: keep that adapter with the chart's "
            "rules (metricsAPI.enabled=false, metricsAdapter.enabled=true) or remove it",
        )
    if not present:
        return (
            False,
            "NoMetricsAPI",
            f"no APIService serves {GROUP}: the HPA cannot read its metrics "
            "(install the chart with metricsAPI.enabled=true)",
        )
    return (
        True,
        "KvserveMetricsAPI",
        f"the HPA reads its metrics from kvserve's metrics API ({ours})",
    )


class MetricsSource:
    """The verdict, read again at most every ``ttl`` seconds (two GETs)."""

    def __init__(
        self,
        api: client.ApiClient,
        ours: str | None = None,
        ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.ours = ours if ours is not None else os.environ.get(METRICS_API_ENV, "")
        self.ttl = ttl
        self.clock = clock
        self._read_at: float | None = None
        self._verdict: Verdict | None = None

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            response = client.ApiregistrationV1Api(self.api).read_api_service(
                name, _preload_content=False
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        # The urllib3 response, unread (``_preload_content=False``): the client's hint names the
        # decoded model whatever the flag.
        return json.loads(response.data)  # type: ignore[attr-defined]

    def verdict(self) -> Verdict | None:
        """None when kvserve's metrics API is not enabled."""
        if not self.ours:
            return None
        now = self.clock()
        if self._read_at is not None and now - self._read_at < self.ttl:
            return self._verdict
        self._read_at = now
        try:
            found = verdict({name: self._get(name) for name in APISERVICES}, self.ours)
        except ApiException as e:  # e.g. 403 without the chart's RBAC: the last verdict stands
            log.warning("APIServices of %s not read: %s %s", GROUP, e.status, e.reason)
            return self._verdict
        if found != self._verdict:
            (log.info if found[0] else log.warning)("%s: %s", found[1], found[2])
        self._verdict = found
        return found
