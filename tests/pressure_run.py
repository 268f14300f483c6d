"""Arrivals under block pressure against transformers: the check the multi-rank engines share."""

from test_engine_interleaving import arrivals

from kvserve import SamplingParams
from kvserve.engine.llm_engine import LLMEngine

from audit import run_audited
from reference import assert_greedy_match, hf_greedy


def assert_arrivals_match_transformers(engine: LLMEngine, path: str, count: int) -> None:
    """The first ``count`` of seed 7's arrivals, greedy, stepped to the end with every block
    audited: each gets transformers' tokens, and the run both preempted and hit the prefix
    cache (so that both paths were crossed)."""
    requests = arrivals(7)[:count]
    for request_id, prompt, max_tokens in requests:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(request_id, prompt, params)
    finished = run_audited(engine)
    for request_id, prompt, max_tokens in requests:
        expected = hf_greedy(path, prompt, max_tokens)
        assert_greedy_match(path, prompt, expected, finished[request_id])
    stats = engine.stats
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0, stats
