"""``kvserve conformance URL``: a running model server against the model-server protocol of
the Gateway API Inference Extension (what an endpoint picker such as llm-d's needs from a
pod), one PASS/FAIL line per check; exit 0 only when every required check passes."""

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from kvserve.conformance.api_checks import (
    check_chat,
    check_completion,
    check_health,
    check_models,
    describe,
)
from kvserve.conformance.client import Server, Unreachable
from kvserve.conformance.kv_event_check import check_kv_events
from kvserve.conformance.metric_checks import (
    CACHE_INFO,
    REQUIRED_GAUGES,
    Families,
    GaugeRule,
    check_cache_info,
    check_gauge,
    parse_metrics,
)
from kvserve.conformance.report import Level, Result, exit_status, summary


def conformance_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.description = __doc__
    add = parser.add_argument
    add("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    add("--model", default=None, help="the model to check (default: the first /v1/models lists)")
    add(
        "--kv-events",
        metavar="ENDPOINT",
        default=None,
        help="the server's KV-event ZMQ publisher, e.g. tcp://127.0.0.1:5557 (else not checked)",
    )
    add("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    add("--timeout", type=float, default=30.0, help="seconds each request or wait may take")
    return parser


@dataclass
class Context:
    """What earlier checks learnt that later ones use."""

    server: Server
    model: str | None
    kv_events: str | None
    families: Families | None = None
    block_size: int | None = None


Outcome = tuple[bool, str]
NO_MODEL = (False, "not run: no model name (give --model, or fix /v1/models)")


def _models(ctx: Context) -> Outcome:
    passed, reason, ctx.model = check_models(ctx.server, ctx.model)
    return passed, reason


def _with_model(check: Callable[[Server, str], Outcome]) -> Callable[[Context], Outcome]:
    def run(ctx: Context) -> Outcome:
        if ctx.model is None:
            return NO_MODEL
        return check(ctx.server, ctx.model)

    return run


def _metrics(ctx: Context) -> Outcome:
    reply = ctx.server.get("/metrics")
    if reply.status != 200:
        return False, describe("GET /metrics", reply)
    try:
        ctx.families = parse_metrics(reply.body.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        return False, f"GET /metrics is not the Prometheus text format: {exc}"
    return True, f"GET /metrics answered 200 in the Prometheus text format ({reply.content_type})"


def _gauge(rule: GaugeRule) -> Callable[[Context], Outcome]:
    def run(ctx: Context) -> Outcome:
        if ctx.families is None:
            return False, "not run: /metrics is unreadable"
        return check_gauge(ctx.families, rule)

    return run


def _cache_info(ctx: Context) -> Outcome:
    if ctx.families is None:
        return False, "not run: /metrics is unreadable"
    passed, reason, ctx.block_size = check_cache_info(ctx.families)
    return passed, reason


def _kv_events(ctx: Context) -> Outcome:
    if ctx.model is None:
        return NO_MODEL
    assert ctx.kv_events is not None, "checks() adds this check only with --kv-events"
    return check_kv_events(ctx.server, ctx.model, ctx.kv_events, ctx.block_size)


Check = tuple[str, Level, Callable[[Context], Outcome]]


def checks(kv_events: bool) -> list[Check]:
    """Every check, in the order it runs; the KV-event check only for ``--kv-events``."""
    required = Level.REQUIRED
    found: list[Check] = [
        ("health", required, lambda ctx: check_health(ctx.server)),
        ("models", required, _models),
        ("completions", required, _with_model(check_completion)),
        ("chat", required, _with_model(check_chat)),
        ("metrics", required, _metrics),
        *((rule.name, required, _gauge(rule)) for rule in REQUIRED_GAUGES),
        (CACHE_INFO, Level.RECOMMENDED, _cache_info),
    ]
    if kv_events:
        found.append(("kv-events", required, _kv_events))
    return found


def run_checks(ctx: Context) -> list[Result]:
    """Every check in order. When the server gives no HTTP answer to the first, the others
    are reported as not run rather than each waiting out its timeout."""
    results: list[Result] = []
    unreachable: str | None = None
    for name, level, check in checks(ctx.kv_events is not None):
        if unreachable is not None:
            results.append(Result(name, level, False, f"not run: {unreachable}"))
            continue
        try:
            passed, reason = check(ctx)
        except Unreachable as exc:
            passed, reason = False, f"no answer: {exc}"
            if not results:
                unreachable = f"the server at {ctx.server.url} does not answer"
        results.append(Result(name, level, passed, reason))
    return results


def run(args: argparse.Namespace) -> int:
    server = Server(args.url.rstrip("/"), args.api_key, args.timeout)
    results = run_checks(Context(server, args.model, args.kv_events))
    for result in results:
        print(result.line())
    print(summary(results))
    return exit_status(results)
