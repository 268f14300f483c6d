"""The chart's monitoring pieces as the tests read them: the dashboard's queries and the metric
names in them, and the alert rules as ``helm template`` renders them."""

import functools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from k8s.support import CACHE, HARNESS, ROOT

CHART = ROOT / "charts" / "kvserve-operator"
DASHBOARD = CHART / "dashboards" / "kvserve.json"
RULE_API = "monitoring.coreos.com/v1/PrometheusRule"

# PromQL words that are not metric names: operators, modifiers and grouping clauses.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_SELECTORS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_NAMES = re.compile(r"(?<![\w:$])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()")
_LABEL_VALUES = re.compile(r"label_values\((.+),\s*(\w+)\)")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (what is left once label matchers, ranges,
    grouping clauses, function calls, numbers and keywords are taken out)."""
    bare = _RANGES.sub("", _SELECTORS.sub("", _LABEL_LISTS.sub("", expr)))
    return {name for name in _NAMES.findall(bare) if name not in _KEYWORDS}


@dataclass(frozen=True)
class Query:
    panel: str
    expr: str


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[Query]:
    return [
        Query(panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def variable_queries() -> dict[str, tuple[str, str]]:
    """Each query variable's ``label_values(SELECTOR, LABEL)`` as ``(SELECTOR, LABEL)``."""
    variables = dashboard()["templating"]["list"]
    queries = [v for v in variables if v["type"] == "query"]
    found = {v["name"]: _LABEL_VALUES.fullmatch(v["query"]["query"]) for v in queries}
    assert None not in found.values(), found
    return {name: (m[1], m[2]) for name, m in found.items() if m is not None}


@functools.cache
def helm() -> Path:
    """helm 4, fetched once into the k8s tests' cache by their harness script."""
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run([str(HARNESS), "tools"], env=env, check=True)
    return CACHE / "tools" / "helm"


def render_chart(tmp_path: Path, *values: str, rule_api: bool = True) -> list[dict[str, Any]]:
    """``helm template`` of the operator chart, on a cluster that serves PrometheusRules
    unless ``rule_api`` is false."""
    env = {**os.environ, **{k: str(tmp_path / k) for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME")}}
    out = subprocess.run(
        [str(helm()), "template", "demo", str(CHART), "--namespace", "kvs",
         *(["--api-versions", RULE_API] if rule_api else []), *values],
        env={**env, "HELM_DATA_HOME": str(tmp_path / "HELM_DATA_HOME")},
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def alert_rules(tmp_path: Path, *values: str) -> dict[str, Any]:
    """The rendered PrometheusRule's ``spec``: a Prometheus rule file's content as it is."""
    (rule,) = [d for d in render_chart(tmp_path, *values) if d["kind"] == "PrometheusRule"]
    return rule["spec"]


def write_rule_file(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
