"""The README's dashboard picture, made with real data, in one command:

    .venv/bin/python scripts/dashboard_snapshot.py

Serves the embedded demo model (``kvserve serve`` on loopback), has Debian's Prometheus
(``make prometheus``) scrape it every second, sends it a bounded load for ``--seconds`` (a
shared system prompt, then prompts and answers of mixed lengths, from 1 up to 8 clients at
once, on 4 sequence slots and 40 KV blocks), and draws every panel of
``charts/kvserve-operator/dashboards/kvserve.json`` from Prometheus' answers to the panel's own
queries, laid out on the dashboard's grid. No Grafana package is in the registries this
project can reach, so matplotlib (the ``bench`` extra) draws the panels instead of Grafana:
same queries, same legends, same layout, not Grafana's pixels.
"""

import argparse
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' Prometheus and server harness

from kvserve.server.cli import DEFAULT_MODEL  # noqa: E402

from monitoring_manifests import DASHBOARD, dashboard  # noqa: E402
from prometheus_server import PrometheusProcess, Target  # noqa: E402
from server_process import ServerProcess  # noqa: E402

VARIABLES = {
    "$namespace": "demo",
    "$model_name": "tiny",  # the name tests/server_process.py serves under
    "$pod": ".*",
    "$__rate_interval": "10s",
    "$hpa_target": "2",
}
SYSTEM = "You are a careful assistant. Answer in short sentences and cite the code you use.\n"
TOPICS = ["a queue", "a binary search", "a retry loop", "a cache", "a parser", "a thread pool"]
# (seconds from the start, clients at once): the load's shape.
PHASES = [(0.0, 1), (0.15, 4), (0.35, 8), (0.6, 2), (0.8, 6)]
BG, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"


def load(server: ServerProcess, seconds: float, seed: int = 0) -> None:
    """Clients that send completions back to back; how many run follows ``PHASES``."""
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    start = time.monotonic()

    def wanted() -> int:
        elapsed = (time.monotonic() - start) / seconds
        return [n for at, n in PHASES if at <= elapsed][-1]

    def client(index: int) -> None:
        while time.monotonic() < end:
            if index >= wanted():
                time.sleep(0.2)
                continue
            prompt = SYSTEM + f"Write {rng.choice(TOPICS)} in Python." * rng.randint(1, 6)
            body = {"model": "tiny", "prompt": prompt, "max_tokens": rng.randint(16, 160)}
            server.post("/v1/completions", body)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def substituted(expr: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    return expr


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), template).strip()


def scaled(unit: str, values: list[float]) -> tuple[list[float], str]:
    if unit == "percentunit":
        return [100 * v for v in values], "%"
    if unit == "s":
        return [1000 * v for v in values], "ms"
    return values, {"reqps": "req/s"}.get(unit, "")


def draw(prometheus: PrometheusProcess, start: float, end: float, out: Path) -> None:
    board = dashboard()
    panels = [p for p in board["panels"] if p["type"] != "row"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(18, rows * 0.3), facecolor=BG)
    fig.suptitle(f"{board['title']}  ·  {board['description']}", color=TEXT, x=0.01, ha="left")
    for panel in panels:
        grid = panel["gridPos"]
        box = [grid["x"] / 24 + 0.035, 1 - (grid["y"] + grid["h"]) / rows + 0.03]
        box += [grid["w"] / 24 - 0.05, grid["h"] / rows - 0.06]
        ax = fig.add_axes(box, facecolor=PANEL)
        ax.set_title(panel["title"], color=TEXT, loc="left", fontsize=10)
        ax.tick_params(colors=TEXT, labelsize=7)
        for side in ax.spines.values():
            side.set_color(GRID)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        if panel["type"] == "bargauge":
            _bars(ax, prometheus, panel, start, end, unit)
        else:
            _lines(ax, prometheus, panel, start, end, unit)
    fig.savefig(out, facecolor=BG, dpi=80)


def _lines(ax, prometheus, panel, start: float, end: float, unit: str) -> None:
    for target in panel["targets"]:
        for series in prometheus.query_range(substituted(target["expr"]), start, end):
            times = [float(t) - start for t, _ in series["values"]]
            values, suffix = scaled(unit, [float(v) for _, v in series["values"]])
            label = legend(target["legendFormat"], series["metric"])
            ax.plot(times, values, linewidth=1.2, label=label)
    ax.grid(color=GRID, linewidth=0.5)
    ax.set_xlabel("seconds", color=TEXT, fontsize=7)
    ax.set_ylabel(suffix if panel["targets"] else "", color=TEXT, fontsize=7)
    ax.legend(fontsize=6, facecolor=PANEL, labelcolor=TEXT, edgecolor=GRID, loc="upper left")


def _bars(ax, prometheus, panel, start: float, end: float, unit: str) -> None:
    (target,) = panel["targets"]
    series = prometheus.query_range(substituted(target["expr"]), start, end)
    names = [legend(target["legendFormat"], s["metric"]) for s in series]
    values, suffix = scaled(unit, [float(s["values"][-1][1]) for s in series])
    ax.barh(names, values, color="#73bf69", edgecolor="none")
    ax.set_xlabel(suffix, color=TEXT, fontsize=7)
    ax.set_axisbelow(True)
    ax.grid(color=GRID, linewidth=0.5, axis="x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DASHBOARD.with_suffix(".png"))
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvserve-dashboard-"))
    flags = ("--max-num-seqs", "4", "--num-kv-blocks", "40")  # few blocks: some preemptions
    with ServerProcess(DEFAULT_MODEL, *flags, log=work / "server.log") as server:
        labels = {"namespace": "demo", "pod": "demo-0", "container": "server"}
        target = Target(f"127.0.0.1:{server.port}", labels)
        with PrometheusProcess(work, [target], []) as prometheus:
            start = prometheus.wait_for_scrape()
            load(server, args.seconds)
            end = prometheus.wait_for_scrape()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            draw(prometheus, start, end, args.out)
    print(f"{args.out}: {end - start:.0f} s of data")


if __name__ == "__main__":
    main()
