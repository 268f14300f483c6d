"""The CustomMetrics verdict: whose APIServices serve custom.metrics.k8s.io."""

from kvserve.operator.metrics_source import verdict

OURS = "kvs/demo-kvserve-operator-metrics-api"


def _apiservice(version: str, namespace: str, name: str) -> dict:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.custom.metrics.k8s.io"},
        "spec": {
            "group": "custom.metrics.k8s.io",
            "version": version,
            "service": {"namespace": namespace, "name": name, "port": 443},
        },
    }


def test_ours_none_and_a_foreign_adapter():
    ours = {
        "v1beta2.custom.metrics.k8s.io": _apiservice("v1beta2", "kvs", OURS.split("/")[1]),
        "v1beta1.custom.metrics.k8s.io": _apiservice("v1beta1", "kvs", OURS.split("/")[1]),
    }
    assert verdict(ours, OURS) == (
        True,
        "KvserveMetricsAPI",
        f"the HPA reads its metrics from kvserve's metrics API ({OURS})",
    )
    none = dict.fromkeys(ours)
    assert verdict(none, OURS) == (
        False,
        "NoMetricsAPI",
        "no APIService serves custom.metrics.k8s.io: the HPA cannot read its metrics "
        "(install the chart with metricsAPI.enabled=true)",
    )
    adapter = {
        "v1beta2.custom.metrics.k8s.io": None,
        "v1beta1.custom.metrics.k8s.io": _apiservice("v1beta1", "monitoring", "prometheus-adapter"),
    }
    assert verdict(adapter, OURS) == (
        False,
        "MetricsAPIConflict",
        "custom.metrics.k8s.io is served by APIService v1beta1.custom.metrics.k8s.io (service "
        "monitoring/prometheus-adapter), not by kvserve's metrics API "
        f"({OURS}); it was left as it is and the HPA reads its metrics from it: keep that "
        "adapter with the chart's rules (metricsAPI.enabled=false, metricsAdapter.enabled=true) "
        "or remove it",
    )
    assert verdict({**ours, **{k: v for k, v in adapter.items() if v}}, OURS)[1] == (
        "MetricsAPIConflict"
    )
