"""Prometheus metrics under the exact vLLM V1 names (``vllm:``), ours under ``kvserve:``.

Dashboards and autoscalers written for vLLM read these unchanged: same names, same
meanings, same ``model_name`` label (``tests/test_server_metrics.py`` holds the list).
Gauges and the engine's cumulative counters are refreshed after every engine step;
per-request histograms are observed when a request finishes.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvserve.engine.outputs import RequestOutput

LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error")  # "error": failed by the engine


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(
                name, doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry
            ).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found cached.")
        self.preemptions = counter("vllm:num_preemptions", "Preemptions of running requests.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.success = {r: success.labels(model_name, r) for r in FINISH_REASONS}
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to the first token.")
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Time per output token.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to finish.")
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to first step.")
        self.draining = gauge("kvserve:draining", "1 while the server drains before exiting.")
        self.rejected = counter(
            "kvserve:requests_rejected", "Requests refused because the waiting queue was full."
        )
        self.step_failures = counter(
            "kvserve:engine_step_failures",
            "Engine steps in which requests failed on an exception (reason error).",
        )
        self._last_counts = (0, 0, 0, 0)
        self._num_tokens_seen: dict[str, int] = {}

    def on_step(self, stats, outputs: list[RequestOutput]) -> None:
        """After an engine step: scheduler gauges, cumulative counters, tokens, finished ones."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self._count(stats)
        for output in outputs:
            seen = self._num_tokens_seen.get(output.request_id, 0)
            total = len(output.outputs[0].token_ids)
            if seen == 0 and total > 0:
                self.prompt_tokens.inc(len(output.prompt_token_ids))
            self.generation_tokens.inc(total - seen)
            self._num_tokens_seen[output.request_id] = total
            if output.finished:
                self._num_tokens_seen.pop(output.request_id)
                self._record_finished(output)

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

    def on_engine_dead(self, stats, num_failed: int) -> None:
        """The engine stopped for good: its ``num_failed`` open requests will never finish."""
        self.running.set(0)
        self.waiting.set(0)
        self._count(stats)
        self.success["error"].inc(num_failed)
        self._num_tokens_seen.clear()

    def on_abort(self, request_id: str) -> None:
        self._num_tokens_seen.pop(request_id, None)
        self.success["abort"].inc()

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
        if output.first_token_time is not None:
            self.ttft.observe(output.first_token_time - output.arrival_time)
            num_tokens = len(completion.token_ids)
            if num_tokens > 1:
                decode_time = output.finished_time - output.first_token_time
                self.tpot.observe(decode_time / (num_tokens - 1))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
