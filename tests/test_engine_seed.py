"""An engine's ``seed`` (``--seed``): unseeded sampling requests become reproducible."""

import pytest

from kvserve.engine.llm import LLM
from kvserve.engine.sampling_params import SamplingParams, request_seed

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]
SAMPLED = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)


def _tokens(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, SAMPLED)]


def test_same_seed_same_tokens_for_unseeded_requests_however_batched(checkpoint) -> None:
    path = str(checkpoint("llama"))
    batched = _tokens(LLM(path, num_kv_blocks=64, seed=7), PROMPTS)
    alone = LLM(path, num_kv_blocks=64, seed=7)
    one_by_one = [_tokens(alone, [p])[0] for p in PROMPTS]
    assert batched == one_by_one
    assert batched[0] != batched[1][: len(batched[0])]


def test_another_seed_other_tokens(checkpoint) -> None:
    path = str(checkpoint("llama"))
    seven = _tokens(LLM(path, num_kv_blocks=64, seed=7), PROMPTS)
    eight = _tokens(LLM(path, num_kv_blocks=64, seed=8), PROMPTS)
    assert [a != b for a, b in zip(seven, eight, strict=True)] == [True, True]


def test_a_request_seed_wins_over_the_engines(checkpoint) -> None:
    path = str(checkpoint("llama"))
    own = SAMPLED.replace(seed=123)
    by_engine = LLM(path, num_kv_blocks=64, seed=7).generate(PROMPTS[:1], own)
    unseeded_engine = LLM(path, num_kv_blocks=64).generate(PROMPTS[:1], own)
    assert by_engine[0].outputs[0].token_ids == unseeded_engine[0].outputs[0].token_ids


def test_request_seeds_are_distinct_and_in_range() -> None:
    seeds = [request_seed(s, i) for s in (0, 1, -1) for i in range(100)]
    assert (len(set(seeds)), min(seeds) >= 0, max(seeds) < 2**63) == (300, True, True)
