"""The dashboard's panels and the chart's alert rules against a real Prometheus that scrapes a
real ``kvserve serve`` through a short, bounded load: every query evaluates, returns numbers,
and reads only metric names the server exports; every alert fires on its live signal."""

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from monitoring_manifests import (
    alert_rules,
    metric_names,
    panel_queries,
    variable_queries,
    write_rule_file,
)
from prometheus_server import PrometheusProcess, Target
from server_process import ServerProcess, _free_port

NAMESPACE, MODEL, POD, LOADING_POD = "kvs", "tiny", "tiny-0", "tiny-1"
VARIABLES = {
    "$namespace": NAMESPACE,
    "$model_name": MODEL,
    "$pod": ".*",
    "$__rate_interval": "30s",
    "$hpa_target": "5",
}
# Thresholds and windows that the short load crosses (the defaults are for production).
ALERT_VALUES = (
    "--set", "alerts.queueGrowthWindow=3s", "--set", "alerts.queueGrowthMinWaiting=2",
    "--set-json", "alerts.kvCacheUsage=0.02", "--set", "alerts.kvCacheWindow=2s",
    "--set-json", "alerts.ttftP99Seconds=0.001", "--set", "alerts.ttftWindow=30s",
)  # fmt: skip
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
# One sequence slot serves a request in about 0.3 s here; they arrive every 0.125 s for 3 s,
# so the queue grows for 3 s and drains for about as long.
NUM_REQUESTS, STAGGER_S, MAX_TOKENS = 24, 0.125, 400


@dataclass(frozen=True)
class Observed:
    prometheus: PrometheusProcess
    rules: list[dict]
    exposition: str  # the server's /metrics after the load
    start: float  # before the load
    loaded: float  # the load done and scraped
    killed: float  # the server killed and its failed scrape stored


def load(server: ServerProcess) -> None:
    """NUM_REQUESTS requests, one every STAGGER_S, on one sequence slot: the queue grows."""

    def one() -> None:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}
        server.post("/v1/completions", body)

    threads = [threading.Thread(target=one) for _ in range(NUM_REQUESTS)]
    for thread in threads:
        thread.start()
        time.sleep(STAGGER_S)
    for thread in threads:
        thread.join(60)


@pytest.fixture(scope="module")
def observed(checkpoint, tmp_path_factory):
    work: Path = tmp_path_factory.mktemp("prometheus")
    spec = alert_rules(work, *ALERT_VALUES)
    rule_file = write_rule_file(work / "kvserve.rules.yaml", spec)
    args = ("--max-num-seqs", "1", "--num-kv-blocks", "64")
    with ServerProcess(checkpoint("llama"), *args, log=work / "server.log") as server:
        pod = {"namespace": NAMESPACE, "container": "server"}
        targets = [
            Target(f"127.0.0.1:{server.port}", {**pod, "pod": POD}),
            Target(f"127.0.0.1:{_free_port()}", {**pod, "pod": LOADING_POD}),  # nothing listens yet
        ]
        with PrometheusProcess(work, targets, [rule_file]) as prometheus:
            start = prometheus.wait_for_scrape()
            load(server)
            loaded = prometheus.wait_for_scrape()
            exposition = server.get("/metrics")
            assert server.process is not None
            server.process.kill()  # as a dead engine's server exits
            server.process.wait()
            killed = prometheus.wait_for_scrape()
            rules = spec["groups"][0]["rules"]
            yield Observed(prometheus, rules, exposition, start, loaded, killed)


def substituted(expr: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    return expr


def exported_names(exposition: str) -> set[str]:
    lines = [line for line in exposition.splitlines() if line and not line.startswith("#")]
    return {line.split("{")[0].split(" ")[0] for line in lines}


def test_every_metric_name_the_dashboard_reads_is_on_the_servers_metrics(observed):
    exported = exported_names(observed.exposition)
    queries = [q.expr for q in panel_queries()]
    queries += [selector for selector, _ in variable_queries().values()]
    read = [metric_names(expr) for expr in queries]
    assert [expr for expr, names in zip(queries, read, strict=True) if not names] == [
        "vector($hpa_target)"  # the HPA's target, a variable: the one query without a metric
    ]
    assert set().union(*read) <= exported, set().union(*read) - exported


def test_every_panel_query_evaluates_to_numbers_over_the_load(observed):
    prometheus = observed.prometheus
    empty = []
    for query in panel_queries():
        series = prometheus.query_range(substituted(query.expr), observed.start, observed.loaded)
        values = [float(v) for s in series for _, v in s["values"]]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{query.panel}: {query.expr}")
    assert empty == []


def test_the_variables_list_the_served_pod_only(observed):
    found = {}
    for name, (selector, label) in variable_queries().items():
        match = substituted(selector)
        found[name] = observed.prometheus.api(f"label/{label}/values", **{"match[]": match})
    assert found == {"namespace": [NAMESPACE], "model_name": [MODEL], "pod": [POD]}


def test_the_rules_load_and_evaluate_without_error(observed):
    (group,) = observed.prometheus.api("rules")["groups"]
    health = {rule["name"]: (rule["health"], rule.get("lastError", "")) for rule in group["rules"]}
    assert health == {rule["alert"]: ("ok", "") for rule in observed.rules}


def firing_pods(observed: Observed, alert: str, start: float, end: float) -> set[str]:
    (rule,) = [r for r in observed.rules if r["alert"] == alert]
    series = observed.prometheus.query_range(rule["expr"], start, end)
    return {s["metric"].get("pod", s["metric"].get("model_name", "")) for s in series}


def test_each_alert_fires_on_its_live_signal(observed):
    during, after = (observed.start, observed.loaded), (observed.killed, observed.killed)
    assert firing_pods(observed, "KvserveQueueGrowing", *during) == {MODEL}
    assert firing_pods(observed, "KvserveKVCacheSaturated", *during) == {POD}
    assert firing_pods(observed, "KvserveTTFTHigh", *during) == {MODEL}
    assert firing_pods(observed, "KvservePodNotReady", *during) == {LOADING_POD}
    assert firing_pods(observed, "KvserveEngineDead", *during) == set()
    assert firing_pods(observed, "KvserveEngineDead", *after) == {POD}
