"""The chart's alert rules (a PrometheusRule) and dashboard (a ConfigMap): rendered only when
asked for, checked by ``promtool``, each alert firing on exactly the series it is about with
the default thresholds, and each with its runbook in the README."""

import json
import re
import subprocess

import yaml

from monitoring_manifests import (
    DASHBOARD,
    ROOT,
    alert_rules,
    render_chart,
    write_rule_file,
)
from prometheus_server import PROMTOOL

ML = 'namespace="ml", model_name="m"'
N = 'namespace="ml", model_name="n"'


def series(name: str, labels: str, values: str) -> dict:
    return {"series": f"{name}{{{labels}}}", "values": values}


def case(alert: str, at: str, inputs: list[dict], firing: list[tuple[dict, dict]]) -> dict:
    """A promtool unit test: ``alert`` at ``at`` fires exactly with these labels and
    annotations (none: it must not fire)."""
    expected = [{"exp_labels": labels, "exp_annotations": notes} for labels, notes in firing]
    check = {"eval_time": at, "alertname": alert, "exp_alerts": expected}
    return {"interval": "1m", "input_series": inputs, "alert_rule_test": [check]}


def runbook(alert: str) -> str:
    return f"README.md#{alert.lower()}"


def notes(alert: str, summary: str, description: str) -> dict:
    return {"summary": summary, "description": description, "runbook": runbook(alert)}


DEAD = "Its engine died (the server exits 1 and the kubelet restarts it) or its process hangs."
UP = 'up{job="ml/m", container="server", namespace="ml", pod="m-0"}'
UNIT_TESTS = [
    # m-0 served until 5m, then its scrapes fail: dead once that lasted engineDeadFor (1m).
    case(
        "KvserveEngineDead",
        "8m",
        [
            {"series": UP, "values": "1x5 0x10"},
            series("vllm:num_requests_running", f'{ML}, pod="m-0"', "0x5"),
        ],
        [
            (
                {
                    "severity": "critical",
                    "job": "ml/m",
                    "container": "server",
                    "namespace": "ml",
                    "pod": "m-0",
                },
                notes(
                    "KvserveEngineDead",
                    "kvserve pod ml/m-0 stopped answering after it served",
                    DEAD,
                ),
            )
        ],
    ),
    case("KvserveEngineDead", "5m", [{"series": UP, "values": "1x5 0x10"}], []),
    # m grows by 2 a minute; n holds 50: only m grows, and past 10 waiting.
    case(
        "KvserveQueueGrowing",
        "25m",
        [
            series("vllm:num_requests_waiting", f'{ML}, pod="m-0"', "0+2x30"),
            series("vllm:num_requests_waiting", N + ', pod="n-0"', "50x30"),
        ],
        [
            (
                {"severity": "warning", "namespace": "ml", "model_name": "m"},
                notes(
                    "KvserveQueueGrowing",
                    "ml/m: the waiting queue keeps growing",
                    "Requests arrive faster than the replicas serve them.",
                ),
            )
        ],
    ),
    # m-0 stays at 97 %, m-1 at 50 %: only m-0 is saturated.
    case(
        "KvserveKVCacheSaturated",
        "25m",
        [
            series("vllm:kv_cache_usage_perc", f'{ML}, pod="m-0"', "0.97x30"),
            series("vllm:kv_cache_usage_perc", f'{ML}, pod="m-1"', "0.5x30"),
        ],
        [
            (
                {"severity": "warning", "namespace": "ml", "model_name": "m", "pod": "m-0"},
                notes(
                    "KvserveKVCacheSaturated",
                    "ml/m-0: KV cache at least 0.95 full for 10m",
                    "New requests wait for blocks and running ones get preempted.",
                ),
            )
        ],
    ),
    # m: 1 request a minute under 1 s, 9 between 1 s and 10 s (p99 9.9 s); n: all under 1 s.
    case(
        "KvserveTTFTHigh",
        "25m",
        [
            series("vllm:time_to_first_token_seconds_bucket", f'{ML}, le="1"', "0+1x30"),
            series("vllm:time_to_first_token_seconds_bucket", f'{ML}, le="10"', "0+10x30"),
            series("vllm:time_to_first_token_seconds_bucket", f'{ML}, le="+Inf"', "0+10x30"),
            series("vllm:time_to_first_token_seconds_bucket", f'{N}, le="1"', "0+10x30"),
            series("vllm:time_to_first_token_seconds_bucket", f'{N}, le="+Inf"', "0+10x30"),
        ],
        [
            (
                {"severity": "warning", "namespace": "ml", "model_name": "m"},
                notes(
                    "KvserveTTFTHigh",
                    "ml/m: time to first token p99 9.9s over 5s",
                    "Requests queue or prefills are slow.",
                ),
            )
        ],
    ),
    # m-2 never answered a scrape; m-3 drains for good; m-4 served and is now unreachable
    # (KvserveEngineDead's, not this one's); m-5 is ready.
    case(
        "KvservePodNotReady",
        "20m",
        [
            {"series": 'up{container="server", namespace="ml", pod="m-2"}', "values": "0x30"},
            {"series": 'up{container="server", namespace="ml", pod="m-4"}', "values": "1 0x30"},
            series("vllm:num_requests_running", f'{ML}, pod="m-4"', "0"),
            {"series": 'up{container="server", namespace="ml", pod="m-5"}', "values": "1x30"},
            series("vllm:num_requests_running", f'{ML}, pod="m-5"', "0x30"),
            series("kvserve:draining", f'{ML}, pod="m-3"', "1x30"),
            series("kvserve:draining", f'{ML}, pod="m-5"', "0x30"),
        ],
        [
            (
                {"severity": "warning", "container": "server", "namespace": "ml", "pod": "m-2"},
                notes(
                    "KvservePodNotReady",
                    "kvserve pod ml/m-2 not Ready for 15m",
                    "It never finished loading its model, or it stays draining.",
                ),
            ),
            (
                {"severity": "warning", "namespace": "ml", "model_name": "m", "pod": "m-3"},
                notes(
                    "KvservePodNotReady",
                    "kvserve pod ml/m-3 not Ready for 15m",
                    "It never finished loading its model, or it stays draining.",
                ),
            ),
        ],
    ),
]


def test_the_default_rules_pass_promtool_check(tmp_path):
    rule_file = write_rule_file(tmp_path / "kvserve.rules.yaml", alert_rules(tmp_path))
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(rule_file)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


def test_each_alert_fires_on_exactly_the_series_it_is_about(tmp_path):
    rule_file = write_rule_file(tmp_path / "kvserve.rules.yaml", alert_rules(tmp_path))
    unit = {"rule_files": [rule_file.name], "evaluation_interval": "1m", "tests": UNIT_TESTS}
    tests = tmp_path / "kvserve.tests.yaml"
    tests.write_text(yaml.safe_dump(unit, sort_keys=False))
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    alerts = {c["alert_rule_test"][0]["alertname"] for c in UNIT_TESTS}
    assert alerts == {r["alert"] for r in alert_rules(tmp_path)["groups"][0]["rules"]}


def test_the_thresholds_are_values(tmp_path):
    spec = alert_rules(tmp_path, "--set-json", "alerts.ttftP99Seconds=2.5")
    (ttft,) = [r for r in spec["groups"][0]["rules"] if r["alert"] == "KvserveTTFTHigh"]
    assert ttft["expr"].endswith("[10m]))) > 2.5")


def test_no_rule_without_the_api_or_when_disabled_and_no_dashboard_unless_asked(tmp_path):
    with_api = {f"{d['kind']}/{d['metadata']['name']}" for d in render_chart(tmp_path)}
    assert "PrometheusRule/demo-kvserve-operator-alerts" in with_api
    assert "ConfigMap/demo-kvserve-operator-dashboard" not in with_api
    off = render_chart(tmp_path, "--set", "alerts.enabled=false")
    assert [d for d in off if d["kind"] == "PrometheusRule"] == []
    without_api = render_chart(tmp_path, rule_api=False)
    assert [d for d in without_api if d["kind"] == "PrometheusRule"] == []


def test_the_dashboard_configmap_holds_the_json_under_the_sidecars_label(tmp_path):
    values = ("--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.namespace=mon")
    (config_map,) = [
        d
        for d in render_chart(tmp_path, *values)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "demo-kvserve-operator-dashboard"
    ]
    assert config_map["metadata"]["namespace"] == "mon"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["kvserve.json"]) == json.loads(DASHBOARD.read_text())


def test_every_alert_has_its_runbook_in_the_readme(tmp_path):
    headings = re.findall(r"^#+ (.+)$", (ROOT / "README.md").read_text(), re.MULTILINE)
    anchors = {re.sub(r"[^\w-]", "", h.lower().replace(" ", "-")) for h in headings}
    for rule in alert_rules(tmp_path)["groups"][0]["rules"]:
        assert rule["annotations"]["runbook"] == runbook(rule["alert"])
        assert rule["alert"].lower() in anchors, rule["alert"]
