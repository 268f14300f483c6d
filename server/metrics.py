"""Prometheus metrics under the exact vLLM V1 names (``vllm:``), ours under ``kvserve:``.

Dashboards, autoscalers and endpoint pickers written for vLLM read these unchanged: same
names, types, label names, meanings and histogram buckets (``tests/test_server_metrics.py``
holds the list), with the ``model_name`` label and no ``engine`` label (one engine per
process) except on ``vllm:cache_config_info``, whose labels are vLLM's. Gauges and the
engine's cumulative counters are refreshed after every engine step, per-token histograms
when a token comes out, per-request ones when a request finishes; ``/metrics`` answers from
an ``ExpositionSnapshot``.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvserve.engine.core.outputs import RequestOutput
from kvserve.engine.startup import StartupPhases
from kvserve.server.metrics_info import register_engine_info
from kvserve.server.metrics_snapshot import ExpositionSnapshot
from kvserve.server.spec_decode_metrics import SpecDecodeMetrics

# vLLM's buckets (vllm/v1/metrics/loggers.py): time to first token; inter-token latency and
# time per output token; request latencies (end to end, queue).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")  # "error": failed by the engine
WAITING_REASONS = ("capacity", "deferred")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


class ServerMetrics:
    def __init__(
        self, model_name: str, max_lora: int | None = None, num_spec_tokens: int | None = None
    ) -> None:
        """``max_lora``: ``--max-loras`` with LoRA on (None: off, no LoRA metric);
        ``num_spec_tokens``: the speculative config's (None: off, no ``spec_decode`` metric)."""
        self.model_name = model_name
        self.max_lora = max_lora
        self.registry = CollectorRegistry()
        registry = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["model_name"], registry=registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["model_name"], registry=registry).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            family = Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry)
            return family.labels(model_name)

        def by(metric: type, name: str, doc: str, label: str, values: tuple[str, ...]) -> dict:
            family = metric(name, doc, ["model_name", label], registry=registry)
            return {value: family.labels(model_name, value) for value in values}

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.waiting_by_reason = by(
            Gauge,
            "vllm:num_requests_waiting_by_reason",
            "Waiting requests by reason: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = not schedulable yet (grammar compiling). They sum to "
            "vllm:num_requests_waiting.",
            "reason",
            WAITING_REASONS,
        )
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found cached.")
        self.preemptions = counter("vllm:num_preemptions", "Preemptions of running requests.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.prompt_by_source = by(
            Counter,
            "vllm:prompt_tokens_by_source",
            "Prompt tokens by source: computed here, or read from the local prefix cache "
            "(never from an external KV transfer here).",
            "source",
            PROMPT_SOURCES,
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Prompt tokens read from a cache instead of computed."
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.success = by(
            Counter,
            "vllm:request_success",
            "Finished requests by finish reason.",
            "finished_reason",
            FINISH_REASONS,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to the first token.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Time between a request's consecutive output tokens.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Time between consecutive output tokens (vLLM's older name of "
            "vllm:inter_token_latency_seconds).",
            TOKEN_LATENCY_BUCKETS,
        )
        self.request_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Per request: time from its first to its last token over its tokens after the first.",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to finish.", REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Arrival to first step.", REQUEST_LATENCY_BUCKETS
        )
        self.draining = gauge("kvserve:draining", "1 while the server drains before exiting.")
        self.rejected = counter(
            "kvserve:requests_rejected", "Requests refused because the waiting queue was full."
        )
        self.step_failures = counter(
            "kvserve:engine_step_failures",
            "Engine steps in which requests failed on an exception (reason error).",
        )
        self.lora_info: Gauge | None = None
        self._lora_labels: tuple[str, str, str] | None = None
        if max_lora is not None:
            # vLLM's labels and value (the time of the last update); one sample, the latest
            self.lora_info = Gauge(
                "vllm:lora_requests_info",
                "Running stats on LoRA requests: the adapters of the running and of the "
                "waiting requests (comma-separated), and --max-loras.",
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                registry=registry,
            )
            self._set_lora_info((), ())
        self.spec_decode: SpecDecodeMetrics | None = None
        if num_spec_tokens is not None:
            self.spec_decode = SpecDecodeMetrics(registry, model_name, num_spec_tokens)
        self._last_counts = (0, 0, 0, 0)
        # Per unfinished request that has tokens: when its latest token came out.
        self._last_token_time: dict[tuple[str, int], float | None] = {}  # by (request, sample)
        self._engine_idle = True  # as of the last step: nothing running, nothing waiting
        self.snapshot = ExpositionSnapshot(registry)

    def describe_engine(self, cache_config: dict[str, str], startup: StartupPhases) -> None:
        """Once the engine is built, before the server reports ready: vLLM's
        ``cache_config_info`` (``cache_config_labels``) and the startup phases."""
        with self.snapshot.update():
            register_engine_info(self.registry, self.model_name, cache_config, startup)
        self.snapshot.rebuild()

    def on_step(self, stats, outputs: list[RequestOutput]) -> None:
        """After an engine step: scheduler gauges, cumulative counters, tokens, finished ones."""
        with self.snapshot.update():
            self._set_gauges(stats)
            self._count(stats)
            for output in outputs:
                self._on_output(output)

    def _set_gauges(self, stats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.waiting_by_reason["capacity"].set(stats.num_waiting - stats.num_waiting_deferred)
        self.waiting_by_reason["deferred"].set(stats.num_waiting_deferred)
        self.kv_usage.set(stats.kv_cache_usage)
        if self.lora_info is not None:
            self._set_lora_info(stats.running_lora_adapters, stats.waiting_lora_adapters)
        self._engine_idle = stats.num_running == stats.num_waiting == 0

    def _set_lora_info(self, running: tuple[str, ...], waiting: tuple[str, ...]) -> None:
        """One sample, labelled with the adapters now, valued when they last changed."""
        assert self.lora_info is not None
        labels = (str(self.max_lora), ",".join(waiting), ",".join(running))
        if labels == self._lora_labels:
            return
        self._lora_labels = labels
        self.lora_info.clear()
        self.lora_info.labels(*labels).set_to_current_time()

    def _on_output(self, output: RequestOutput) -> None:
        """vLLM's per-output accounting of a delta: the prompt's tokens by source with the
        first token, then one inter-token latency per later output that brings tokens; each
        sample of a request (``n > 1``) counts as a request of its own."""
        completion = output.outputs[0]
        sample = (output.request_id, completion.index)
        new = len(completion.token_ids)
        last_token_time = self._last_token_time.get(sample)
        if new and completion.num_output_tokens == new:
            self._count_prompt(output)
        elif new and last_token_time is not None and output.last_token_time is not None:
            latency = output.last_token_time - last_token_time
            self.itl.observe(latency)
            self.tpot.observe(latency)
        self.generation_tokens.inc(new)
        if new:
            self._last_token_time[sample] = output.last_token_time
        if completion.finish_reason is not None:
            self._last_token_time.pop(sample, None)
            self._record_finished(output)

    def _count_prompt(self, output: RequestOutput) -> None:
        num_prompt, num_cached = len(output.prompt_token_ids), output.num_cached_tokens
        self.prompt_tokens.inc(num_prompt)
        self.prompt_by_source["local_compute"].inc(num_prompt - num_cached)
        self.prompt_by_source["local_cache_hit"].inc(num_cached)
        self.prompt_cached.inc(num_cached)

    def _count(self, stats) -> None:
        counts = (
            stats.prefix_cache_queries,
            stats.prefix_cache_hits,
            stats.num_preemptions,
            stats.num_failed_steps,
        )
        metrics = (self.prefix_queries, self.prefix_hits, self.preemptions, self.step_failures)
        for metric, new, old in zip(metrics, counts, self._last_counts, strict=True):
            metric.inc(max(new - old, 0))
        self._last_counts = counts
        if self.spec_decode is not None and stats.spec_decoding is not None:
            self.spec_decode.count(stats.spec_decoding)

    def on_engine_dead(self, stats, num_failed: int) -> None:
        """The engine stopped for good: its ``num_failed`` open requests will never finish."""
        with self.snapshot.update():
            self.running.set(0)
            self.waiting.set(0)
            for gauge in self.waiting_by_reason.values():
                gauge.set(0)
            self._count(stats)
            self.success["error"].inc(num_failed)
            self._last_token_time.clear()
        self.snapshot.rebuild()

    def on_abort(self, request_id: str, stats, num_aborted: int) -> None:
        """An abort (of ``num_aborted`` samples still running) is counted in the same update
        as the gauges it lowered."""
        with self.snapshot.update():
            self._set_gauges(stats)
            for sample in [s for s in self._last_token_time if s[0] == request_id]:
                del self._last_token_time[sample]
            self.success["abort"].inc(num_aborted)

    def on_rejected(self) -> None:
        with self.snapshot.update():
            self.rejected.inc()

    def on_draining(self) -> None:
        with self.snapshot.update():
            self.draining.set(1)
        self.snapshot.rebuild()

    def _record_finished(self, output: RequestOutput) -> None:
        """One finished request: its reason and its latency histograms."""
        completion = output.outputs[0]
        reason = completion.finish_reason or "abort"
        self.success[reason].inc()
        if output.finished_time is None:
            return
        self.e2e.observe(output.finished_time - output.arrival_time)
        if output.first_scheduled_time is not None:
            self.queue_time.observe(output.first_scheduled_time - output.arrival_time)
        first, last = output.first_token_time, output.last_token_time
        if first is not None:
            self.ttft.observe(first - output.arrival_time)
            num_tokens = completion.num_output_tokens
            if num_tokens > 1 and last is not None:
                self.request_tpot.observe((last - first) / (num_tokens - 1))

    def exposition(self) -> bytes:
        """What ``/metrics`` answers: the latest snapshot. Only when it is behind and the
        engine has nothing to run (so that nothing competes with it) is it rebuilt first: a
        scrape after the last request finished shows that request."""
        if self._engine_idle and self.snapshot.stale:
            self.snapshot.rebuild()
        return self.snapshot.body
