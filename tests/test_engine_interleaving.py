"""Requests arriving and being aborted between any two steps, under block pressure with
prefix caching and chunked prefill: after every step each block's references match the
requests holding it, an aborted request says nothing more, every other request ends with
exactly its own greedy tokens (transformers'), and at the end every block is free; the same
with n-gram speculative decoding, whose drafts are both accepted and rejected, and with a
draft model (the target itself: every draft accepted)."""

import random

import pytest
from joined_outputs import JoinedOutputs

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine

from audit import assert_all_released, audit_blocks
from reference import assert_greedy_match, hf_greedy

pytestmark = pytest.mark.usefixtures("scheduling")

ARRIVALS = 40
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}


def arrivals(seed: int) -> list[tuple[str, list[int], int]]:
    """ARRIVALS prompts (prefixes shared by about a third of them, some whole prompts
    repeated, so that equal blocks are computed in one step and found cached in later
    ones) with their max_tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 512) for _ in range(rng.randrange(4, 21))] for _ in range(4)]
    requests: list[tuple[str, list[int], int]] = []
    for i in range(ARRIVALS):
        if requests and rng.random() < 0.15:
            prompt = list(rng.choice(requests)[1])
        else:
            body = [rng.randrange(3, 512) for _ in range(rng.randrange(1, 25))]
            prompt = (rng.choice(prefixes) if rng.random() < 0.35 else []) + body
        requests.append((str(i), prompt, rng.randrange(1, 21)))
    return requests


@pytest.mark.parametrize(
    "speculative_config", [None, NGRAM, "draft"], ids=["plain", "ngram", "draft_model"]
)
@pytest.mark.parametrize("seed", range(4))
def test_arrivals_and_aborts_between_any_steps_keep_every_block_and_token(
    checkpoint, seed, speculative_config
):
    path = str(checkpoint("llama"))
    if speculative_config == "draft":
        speculative_config = {"method": "draft_model", "model": path, "num_speculative_tokens": 3}
    engine = LLMEngine(
        EngineConfig(
            model=path,
            dtype="float32",
            block_size=4,
            num_kv_blocks=24,
            max_num_batched_tokens=24,
            max_num_seqs=6,
            enable_prefix_caching=True,
            speculative_config=speculative_config,
        )
    )
    rng = random.Random(seed + 1000)
    pending = arrivals(seed)
    prompts = {request_id: (prompt, max_tokens) for request_id, prompt, max_tokens in pending}
    live: list[str] = []
    aborted: set[str] = set()
    finished: dict[str, list[int]] = {}
    seen = JoinedOutputs()
    while pending or engine.has_unfinished_requests():
        for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
            if pending:
                request_id, prompt, max_tokens = pending.pop(0)
                params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
                engine.add_request(request_id, prompt, params)
                live.append(request_id)
        if live and rng.random() < 0.12:
            request_id = live.pop(rng.randrange(len(live)))
            engine.abort_request(request_id)
            aborted.add(request_id)
        audit_blocks(engine)
        for out in seen.add(engine.step()):
            assert out.request_id not in aborted, out
            if out.finished:
                assert out.outputs[0].finish_reason == "length", out
                finished[out.request_id] = out.outputs[0].token_ids
                live.remove(out.request_id)
        audit_blocks(engine)
    assert_all_released(engine)
    assert sorted(finished.keys() | aborted, key=int) == [str(i) for i in range(ARRIVALS)]
    assert not finished.keys() & aborted
    for request_id, tokens in finished.items():
        prompt, max_tokens = prompts[request_id]
        assert_greedy_match(path, prompt, hf_greedy(path, prompt, max_tokens), tokens)
    stats = engine.stats
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0, stats
    assert len(aborted) >= 3
    if engine.speculator is not None:
        spec = engine.speculator.stats
        assert spec.num_accepted_tokens > 0, spec
        if speculative_config is NGRAM:
            assert spec.num_accepted_tokens < spec.num_draft_tokens, spec
        else:
            assert spec.num_accepted_tokens == spec.num_draft_tokens, spec
