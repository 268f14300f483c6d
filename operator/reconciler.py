"""One level-based reconciliation of an LLMDeployment: read, render, apply, report.

``reconcile`` looks only at the resource and the cluster as they are now, never at what changed,
so it converges from any starting point: a first create, an operator restart, a child deleted
by hand. Running it twice in a row changes nothing the second time.
"""

import json
import os
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from kubernetes.client.rest import ApiException

from kvserve.operator.children import desired_children, obsolete_children
from kvserve.operator.discovery import discover
from kvserve.operator.kube import Kube
from kvserve.operator.spec import InvalidSpec, parse_spec
from kvserve.operator.status import build_status, reported_problem

IMAGE_ENV = "KVSERVE_SERVING_IMAGE"
"""The serving image when a spec names none (the chart sets it to its own image)."""


def _message(error: ApiException) -> str:
    """The message of the API server's Status answer, else the HTTP status line."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def default_image() -> str:
    return os.environ.get(IMAGE_ENV) or f"kvserve:{version('kvserve')}"


@dataclass(frozen=True)
class Outcome:
    status: dict[str, Any]
    problem: tuple[str, str] | None
    """(reason, message) for the Event when the spec cannot be reconciled."""


class Reconciler:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def _deployment(self, owner: dict[str, Any]) -> dict[str, Any] | None:
        meta = owner["metadata"]
        return self.kube.get("apps/v1", "Deployment", meta["namespace"], meta["name"])

    def reconcile(self, owner: dict[str, Any]) -> Outcome:
        """Apply every child the spec asks for, delete the obsolete ones, compute the status.

        An invalid spec, or one the API server rejects (400/422), leaves the children of the
        last valid spec running and is reported as ``Degraded``. Other API errors propagate,
        for the caller to retry with a delay.
        """
        meta = owner["metadata"]
        try:
            spec, source = parse_spec(dict(owner["spec"]))
        except InvalidSpec as e:
            problem = ("InvalidSpec", str(e))
            return Outcome(build_status(owner, self._deployment(owner), problem), problem)
        apis = discover(self.kube.api)
        current = self._deployment(owner)
        replicas = current["spec"].get("replicas") if current else None
        image = spec.image or default_image()
        deployment = current
        try:
            for child in desired_children(owner, spec, source, apis, image, replicas):
                applied = self.kube.apply(child)
                if child["kind"] == "Deployment":
                    deployment = applied
        except ApiException as e:
            if e.status not in (400, 422):
                raise
            problem = ("ApplyFailed", f"the API server rejected a child: {_message(e)}")
            return Outcome(build_status(owner, deployment, problem), problem)
        for api_version, kind in obsolete_children(spec, apis):
            self.kube.delete(api_version, kind, meta["namespace"], meta["name"])
        return Outcome(build_status(owner, deployment), None)

    def status(self, owner: dict[str, Any]) -> dict[str, Any]:
        """The status from the Deployment as it is now, without applying anything."""
        problem = None
        try:
            parse_spec(dict(owner["spec"]))
        except InvalidSpec as e:
            problem = ("InvalidSpec", str(e))
        observed = (owner.get("status") or {}).get("observedGeneration")
        if problem is None and observed == owner["metadata"].get("generation"):
            problem = reported_problem(owner)  # e.g. ApplyFailed: holds until the spec changes
        return build_status(owner, self._deployment(owner), problem)
