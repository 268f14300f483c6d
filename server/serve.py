"""The server process: load the engine, serve HTTP, drain on SIGTERM, exit 0; exit 1 once
the engine died (after the open requests got their errors), so that the kubelet restarts it."""

import argparse
import asyncio
import gc
import logging
import signal
import sys
from typing import TYPE_CHECKING

from aiohttp import web

from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.engine_builder import build_engine
from kvserve.engine.frozen_heap import frozen_heap
from kvserve.engine.llm_engine import LLMEngine
from kvserve.server import smollm2
from kvserve.server.app import build_app
from kvserve.server.cli import DEFAULT_MODEL, default_model, engine_config
from kvserve.server.drain import DrainState
from kvserve.server.metrics import ServerMetrics
from kvserve.server.metrics_info import cache_config_labels
from kvserve.server.served_loras import ServedLoRAs
from kvserve.server.state import ServerState

if TYPE_CHECKING:
    from kvserve.server.tracing import RequestTracer

log = logging.getLogger("kvserve.server")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# After the drain deadline: how long the cut responses get to send their last bytes, and
# then how long aiohttp waits for any handler left before cancelling it.
CUT_GRACE_SECONDS = 1.0
# After the engine died: how long the open requests get to send their errors before the exit.
DEAD_GRACE_SECONDS = 5.0


class LoadProgress:
    """Weight-loading progress: a bar on a terminal, log lines otherwise."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if self.tty:
            filled = 30 * done // max(total, 1)
            bar = "#" * filled + "." * (30 - filled)
            end = "\n" if done >= total else ""
            self.stream.write(f"\rloading weights [{bar}] {done}/{total}{end}")
            self.stream.flush()
        else:
            log.info("loading weights: %d/%d files", done, total)


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    name = args.served_model_name or args.model
    if not args.model:
        args.model, default_name = default_model()
        name = name or default_name
        if args.model == DEFAULT_MODEL:
            log.warning(
                "SmolLM2-135M-Instruct is not in %s (`python -m kvserve.server.smollm2` fetches "
                "it; make setup runs it): serving the embedded demo model %s",
                smollm2.model_path().parent,
                default_name,
            )
    try:
        config = engine_config(args)
        engine = build_engine(config, LoadProgress())
    except (ValueError, OSError) as exc:
        log.error("cannot load the model: %s", exc)
        return 2
    loras = ServedLoRAs()
    for module in args.lora_modules or ():
        lora = loras.new_request(module.name, module.path)
        try:
            engine.add_lora(lora)
        except ValueError as exc:
            log.error("cannot load --lora-modules %s: %s", module.name, exc)
            return 2
        loras.add(lora, module.base_model_name or name)
    plan = engine.plan
    assert plan.num_kv_blocks is not None
    log.info(
        "the KV cache holds %d requests at the full context of %d tokens",
        plan.num_kv_blocks // plan.max_blocks_held_per_seq,
        plan.max_model_len,
    )
    try:
        tracer = _tracer(args)
    except ValueError as exc:
        log.error("cannot trace requests: %s", exc)
        return 2
    return asyncio.run(_serve(args, engine, name, tracer, loras))


async def _serve(
    args: argparse.Namespace,
    engine: LLMEngine,
    name: str,
    tracer: "RequestTracer | None",
    loras: ServedLoRAs,
) -> int:
    spec = engine.config.speculative_config
    metrics = ServerMetrics(
        name,
        engine.config.max_loras if engine.config.enable_lora else None,
        spec.num_speculative_tokens if spec is not None else None,
    )
    metrics.describe_engine(cache_config_labels(engine), engine.startup)
    llm = AsyncLLM(engine, metrics)
    llm.start()
    drain = DrainState()
    state = ServerState(
        llm=llm,
        model_name=name,
        model_path=llm.model_path,
        metrics=metrics,
        drain=drain,
        api_key=args.api_key,
        max_waiting_requests=args.max_waiting_requests,
        body_timeout=args.request_body_timeout,
        auto_tool_parser=args.tool_call_parser if args.enable_auto_tool_choice else None,
        reasoning_parser=args.reasoning_parser,
        tracer=tracer,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
        loras=loras,
    )
    runner = web.AppRunner(
        build_app(state),
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=args.timeout_keep_alive,
        auto_decompress=False,  # read_json decompresses, so that every failure is OpenAI-shaped
        shutdown_timeout=CUT_GRACE_SECONDS,
    )
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    with frozen_heap(collect=True):
        log.info("%d start-up objects frozen out of the garbage collector", gc.get_freeze_count())
        died = await _serve_until_stopped(args, name, drain, metrics, llm)
        await runner.cleanup()
        llm.shutdown()
        if state.tracer is not None:
            state.tracer.shutdown()
    if died:
        log.critical("exiting: the engine died (%s)", llm.error)
        return 1
    log.info("stopped")
    return 0


def _tracer(args: argparse.Namespace) -> "RequestTracer | None":
    """With ``--otlp-traces-endpoint`` only: the SDK is imported here, never when it is off."""
    if args.otlp_traces_endpoint is None:
        return None
    from kvserve.server.tracing import RequestTracer, span_exporter

    log.info("tracing requests to %s", args.otlp_traces_endpoint)
    exporter = span_exporter(args.otlp_traces_endpoint)
    return RequestTracer(exporter, detailed=args.collect_detailed_traces is not None)


async def _serve_until_stopped(
    args: argparse.Namespace, name: str, drain: DrainState, metrics: ServerMetrics, llm: AsyncLLM
) -> bool:
    """Serve until SIGTERM or SIGINT, then drain: wait for the requests in flight (cut at
    the deadline); or until the engine dies, then wait (``DEAD_GRACE_SECONDS`` at most) for
    the requests in flight to send their errors. Whether the engine died."""
    drain.loaded = True
    log.info("serving %s on http://%s:%d", name, args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    assert llm.dead is not None
    stopped, dead = asyncio.create_task(stop.wait()), asyncio.create_task(llm.dead.wait())
    await asyncio.wait([stopped, dead], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    dead.cancel()
    if llm.dead.is_set():
        await drain.wait_idle(DEAD_GRACE_SECONDS)
        return True
    drain.start_draining()
    metrics.on_draining()
    log.info("draining %d requests (at most %.0f s)", drain.in_flight, args.shutdown_timeout)
    if not await drain.wait_idle(args.shutdown_timeout):
        log.warning("drain timeout: %d requests still in flight are cut", drain.in_flight)
        drain.cut()
        await drain.wait_idle(CUT_GRACE_SECONDS)
    return False
