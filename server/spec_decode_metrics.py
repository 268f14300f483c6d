"""vLLM's speculative-decoding counters (registered only with ``--speculative-config``)."""

from prometheus_client import CollectorRegistry, Counter

from kvserve.engine.spec_decode.stats import SpecDecodeStats


class SpecDecodeMetrics:
    """``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens`` and
    ``_num_accepted_tokens_per_pos`` (label ``position``, 0 to ``num_spec_tokens`` - 1),
    raised to the engine's cumulative ``SpecDecodeStats`` after each step."""

    def __init__(self, registry: CollectorRegistry, model_name: str, num_spec_tokens: int) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["model_name"], registry=registry).labels(model_name)

        self.drafts = counter("vllm:spec_decode_num_drafts", "Runs of draft tokens verified.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.accepted = counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens the target model accepted."
        )
        per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by their position in the run of drafts.",
            ["model_name", "position"],
            registry=registry,
        )
        self.per_pos = [per_pos.labels(model_name, str(i)) for i in range(num_spec_tokens)]
        self._last = SpecDecodeStats(num_spec_tokens)

    def count(self, stats: SpecDecodeStats) -> None:
        last = self._last
        self.drafts.inc(stats.num_drafts - last.num_drafts)
        self.draft_tokens.inc(stats.num_draft_tokens - last.num_draft_tokens)
        self.accepted.inc(stats.num_accepted_tokens - last.num_accepted_tokens)
        for metric, new, old in zip(
            self.per_pos,
            stats.num_accepted_tokens_per_pos,
            last.num_accepted_tokens_per_pos,
            strict=True,
        ):
            metric.inc(new - old)
        self._last = SpecDecodeStats(
            stats.num_spec_tokens,
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            list(stats.num_accepted_tokens_per_pos),
        )
