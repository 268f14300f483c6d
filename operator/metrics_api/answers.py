"""The documents the API answers with, in exactly the shapes each version defines.

Discovery (``APIGroupList``, ``APIGroup``, ``APIResourceList``) is the same for both versions.
A ``MetricValueList`` differs: v1beta1 names the metric in ``metricName`` and carries the
metric selector as ``selector`` (always present, ``null`` when none); v1beta2 nests both in
``metric: {name, selector}`` and leaves an absent selector out. A single named object is
answered as a list of one, as the HPA's client expects.
"""

from typing import Any

from kvserve.operator.metrics_api.catalog import SERVED_METRICS
from kvserve.operator.metrics_api.scrape import PodTarget, Sample

GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta2", "v1beta1")
"""Newest first: discovery prefers v1beta2; the HPA of Kubernetes 1.20 reads v1beta1."""


def _group_version(version: str) -> dict[str, str]:
    return {"groupVersion": f"{GROUP}/{version}", "version": version}


def api_group() -> dict[str, Any]:
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [_group_version(v) for v in VERSIONS],
        "preferredVersion": _group_version(VERSIONS[0]),
    }


def api_group_list() -> dict[str, Any]:
    group = api_group()
    del group["kind"], group["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}


def api_resource_list(version: str) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{version}",
        "resources": [
            {
                "name": f"pods/{name}",
                "singularName": "",
                "namespaced": True,
                "kind": "MetricValueList",
                "verbs": ["get"],
            }
            for name in SERVED_METRICS
        ],
    }


def quantity(value: float) -> str:
    """A Kubernetes Quantity in canonical form: whole numbers plain, else milli-units."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _metric_value(version: str, metric: str, target: PodTarget, sample: Sample) -> dict:
    described = {
        "kind": "Pod",
        "namespace": target.namespace,
        "name": target.name,
        "apiVersion": "v1",
    }
    timestamp = sample.timestamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    value = quantity(sample.values[metric])
    if version == "v1beta1":
        return {
            "describedObject": described,
            "metricName": metric,
            "timestamp": timestamp,
            "value": value,
            "selector": None,
        }
    return {
        "describedObject": described,
        "metric": {"name": metric},
        "timestamp": timestamp,
        "value": value,
    }


def metric_value_list(
    version: str, metric: str, samples: dict[PodTarget, Sample]
) -> dict[str, Any]:
    """The pods' values of ``metric``, in the order given; pods without it are left out."""
    return {
        "kind": "MetricValueList",
        "apiVersion": f"{GROUP}/{version}",
        "metadata": {},
        "items": [
            _metric_value(version, metric, target, sample)
            for target, sample in samples.items()
            if metric in sample.values
        ],
    }


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``meta/v1`` Status, the error body every Kubernetes API answers with."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
