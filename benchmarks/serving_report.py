"""What the serving benchmark reports: per workload and target, latency percentiles,
throughput and goodput (``summarize``), the markdown tables and the two PNG plots. With
several rounds, every figure is the median over the rounds, and a ratio the median of the
rounds' own ratios (round i of each target ran minutes apart)."""

import statistics
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
from serving_client import Record


@dataclass(frozen=True)
class Slo:
    """A request meets it when its TTFT ≤ ttft_s and the p99 of its own inter-token
    latencies ≤ itl_ms (a request with one token meets the second part)."""

    ttft_s: float
    itl_ms: float

    def __str__(self) -> str:
        return f"TTFT ≤ {self.ttft_s:g} s, ITL p99 ≤ {self.itl_ms:g} ms"

    def met(self, record: Record) -> bool:
        return record.ttft <= self.ttft_s and record.itl_p99 * 1000 <= self.itl_ms


@dataclass(frozen=True)
class Summary:
    workload: str
    target: str
    requests: int
    failed: int
    wall_s: float
    output_tokens: int
    ttft_s: tuple[float, float]
    """p50, p99 over the requests."""
    itl_ms: tuple[float, float]
    """p50, p99 over every inter-token gap of every request."""
    e2e_s: tuple[float, float]
    met_slo: int
    multi_token_chunks: float
    """The share of the chunks that brought more than one token."""
    prefix_hit_rate: float
    """Prompt tokens found in the prefix cache ÷ those looked up, over the workload (nan
    where the server exports no such counters)."""
    round: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def goodput(self) -> float:
        """Requests per second that met the SLO."""
        return self.met_slo / self.wall_s if self.wall_s else 0.0


def _p50_p99(values: list[float], scale: float = 1.0) -> tuple[float, float]:
    if not values:
        return (float("nan"), float("nan"))
    p50, p99 = np.percentile(values, [50, 99])
    return (float(p50) * scale, float(p99) * scale)


def summarize(
    workload: str,
    target: str,
    records: list[Record],
    wall_s: float,
    slo: Slo,
    prefix: float,
    round_: int = 0,
) -> Summary:
    done = [r for r in records if r.error is None]
    chunks = sum(len(r.chunks) for r in done)
    return Summary(
        workload=workload,
        target=target,
        requests=len(records),
        failed=len(records) - len(done),
        wall_s=wall_s,
        output_tokens=sum(r.output_tokens for r in done),
        ttft_s=_p50_p99([r.ttft for r in done]),
        itl_ms=_p50_p99([g for r in done for g in r.itl], 1000),
        e2e_s=_p50_p99([r.end for r in done]),
        met_slo=sum(1 for r in done if slo.met(r)),
        multi_token_chunks=sum(r.multi_token_chunks for r in done) / chunks if chunks else 0.0,
        prefix_hit_rate=prefix,
        round=round_,
    )


def _median(values: list) -> float | int | tuple:
    if isinstance(values[0], tuple):
        return tuple(statistics.median(v) for v in zip(*values, strict=True))
    if isinstance(values[0], int):
        return statistics.median_low(values)
    return statistics.median(values)


def median_summary(rounds: list[Summary]) -> Summary:
    """One target's rounds of one workload as one Summary: each field's median (the
    failures: the most of any round)."""
    first = rounds[0]
    medians = {
        f.name: _median([getattr(r, f.name) for r in rounds])
        for f in fields(Summary)
        if f.name not in ("workload", "target", "round")
    }
    medians["failed"] = max(r.failed for r in rounds)
    return replace(first, **medians)


def medians(summaries: list[Summary]) -> list[Summary]:
    """Each (workload, target)'s median_summary, in first-seen order."""
    groups: dict[tuple[str, str], list[Summary]] = {}
    for s in summaries:
        groups.setdefault((s.workload, s.target), []).append(s)
    return [median_summary(rounds) for rounds in groups.values()]


HIGHER, LOWER, NO_RATIO = 1, -1, 0
ROWS = [  # (metric, value, format, which way is better: the ratio column shows it unless 0)
    ("output tok/s", lambda s: s.tokens_per_s, "{:.1f}", HIGHER),
    ("goodput (req/s at the SLO)", lambda s: s.goodput, "{:.3f}", HIGHER),
    ("requests meeting the SLO", lambda s: s.met_slo, "{:d}", NO_RATIO),
    ("TTFT p50 (s)", lambda s: s.ttft_s[0], "{:.3f}", LOWER),
    ("TTFT p99 (s)", lambda s: s.ttft_s[1], "{:.3f}", LOWER),
    ("ITL p50 (ms)", lambda s: s.itl_ms[0], "{:.1f}", LOWER),
    ("ITL p99 (ms)", lambda s: s.itl_ms[1], "{:.1f}", LOWER),
    ("E2E p50 (s)", lambda s: s.e2e_s[0], "{:.2f}", LOWER),
    ("E2E p99 (s)", lambda s: s.e2e_s[1], "{:.2f}", LOWER),
    ("wall (s)", lambda s: s.wall_s, "{:.1f}", LOWER),
    ("output tokens", lambda s: s.output_tokens, "{:d}", NO_RATIO),
    ("failed requests", lambda s: s.failed, "{:d}", NO_RATIO),
    ("chunks with > 1 token", lambda s: s.multi_token_chunks * 100, "{:.1f} %", NO_RATIO),
    (
        "prefix-cache hits (of prompt tokens)",
        lambda s: s.prefix_hit_rate * 100,
        "{:.1f} %",
        NO_RATIO,
    ),
]


def _ratio_cell(a_rounds: list[Summary], b_rounds: list[Summary], value, better: int) -> str:
    """The median over paired rounds of a's value ÷ b's; with several rounds, also in how
    many of them a was at least as good as b."""
    pairs = [(value(a), value(b)) for a, b in zip(a_rounds, b_rounds, strict=False)]
    ratios = [x / y for x, y in pairs if y and x == x and y == y]
    if not ratios:
        return ""
    cell = f"{statistics.median(ratios):.2f}×"
    if len(ratios) > 1:
        as_good = sum(1 for r in ratios if (r >= 1 if better == HIGHER else r <= 1))
        cell += f" ({as_good}/{len(ratios)})"
    return cell


def workload_table(summaries: list[Summary], ratio: tuple[str, str] | None) -> list[str]:
    """One row per metric, one column per target (its median over the rounds), then
    `ratio` = (a, b): the median of a ÷ b over the rounds, and with several rounds in how
    many a was at least as good as b."""
    by_target: dict[str, list[Summary]] = {}
    for s in summaries:
        by_target.setdefault(s.target, []).append(s)
    middle = {t: median_summary(rounds) for t, rounds in by_target.items()}
    head = ["metric", *by_target]
    if ratio:
        head.append(f"{ratio[0]} ÷ {ratio[1]}")
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for name, value, fmt, better in ROWS:
        cells = [fmt.format(value(m)) for m in middle.values()]
        if ratio:
            a, b = (by_target[t] for t in ratio)
            cells.append(_ratio_cell(a, b, value, better) if better != NO_RATIO else "")
        lines.append(
            f"| {name} | " + " | ".join(cells).replace("nan %", "—").replace("nan", "—") + " |"
        )
    return lines


def _bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    """Grouped bars: one group per entry of `groups`, one bar per series, values on top."""
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(groups))
    for i, (label, values) in enumerate(series.items()):
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks(x, groups)
    ax.margins(y=0.15)
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)


def _grid(summaries: list[Summary], metrics, groups: list[str], path: Path, title: str) -> None:
    """One row per metric (name, function of a Summary giving one value per group), one
    column per workload, one bar per target in each group. matplotlib (the `bench` extra)
    is imported here, not at the top: the tables and the benchmarks' tests need none of it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(s.workload for s in summaries))
    targets = list(dict.fromkeys(s.target for s in summaries))
    at = {(s.workload, s.target): s for s in summaries}
    fig, axes = plt.subplots(
        len(metrics), len(workloads), figsize=(3.2 * len(workloads), 2.8 * len(metrics)),
        squeeze=False, constrained_layout=True,
    )  # fmt: skip
    for row, (name, metric) in zip(axes, metrics, strict=True):
        for ax, w in zip(row, workloads, strict=True):
            series = {t: list(metric(at[w, t])) for t in targets if (w, t) in at}
            _bars(ax, groups, series)
            ax.set_title(f"{w}: {name}", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot(summaries: list[Summary], latency_png: Path, throughput_png: Path, title: str) -> None:
    """Latency percentiles (TTFT, ITL, E2E, p50 and p99) and throughput (output tok/s,
    goodput) per workload, both targets side by side (medians over the rounds)."""
    summaries = medians(summaries)
    latency = [
        ("TTFT (s)", lambda s: s.ttft_s),
        ("ITL (ms)", lambda s: s.itl_ms),
        ("E2E (s)", lambda s: s.e2e_s),
    ]
    _grid(summaries, latency, ["p50", "p99"], latency_png, f"Latency, lower is better — {title}")
    throughput = [
        ("output tok/s", lambda s: (s.tokens_per_s,)),
        ("goodput (req/s)", lambda s: (s.goodput,)),
    ]
    _grid(summaries, throughput, [""], throughput_png, f"Throughput, higher is better — {title}")
