"""``n`` samples of one prompt, drawn by the engine: the offline API and the server take the
same path (``engine/core/parent_request.py``)."""

import pytest

from kvserve.engine.config import EngineConfig
from kvserve.engine.llm import LLM
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.sampling_params import SamplingParams

from audit import assert_all_released, audit_blocks
from reference import assert_greedy_match, hf_greedy

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPT = list(range(5, 41))  # 36 tokens: two full blocks of 16 and four more
SAMPLED = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)


def test_offline_n_gives_n_greedy_completions_each_transformers(checkpoint):
    path = str(checkpoint("llama"))
    greedy = SamplingParams(n=3, temperature=0, max_tokens=8, ignore_eos=True)
    (out,) = LLM(path, num_kv_blocks=64).generate([PROMPT], greedy)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert out.finished and {c.finish_reason for c in out.outputs} == {"length"}
    for completion in out.outputs:
        assert_greedy_match(path, PROMPT, hf_greedy(path, PROMPT, 8), completion.token_ids)


def test_seeded_sample_i_is_the_single_request_with_seed_plus_i(checkpoint):
    path = str(checkpoint("llama"))
    llm = LLM(path, num_kv_blocks=64)
    (together,) = llm.generate([PROMPT], SAMPLED.replace(n=3, seed=40))
    alone = llm.generate([PROMPT] * 3, [SAMPLED.replace(seed=40 + i) for i in range(3)])
    assert [c.token_ids for c in together.outputs] == [a.outputs[0].token_ids for a in alone]
    assert len({tuple(c.token_ids) for c in together.outputs}) == 3


def test_the_other_samples_start_from_the_first_ones_cached_prompt(checkpoint):
    engine = LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64))
    engine.add_request("r", PROMPT, SAMPLED.replace(n=3))
    assert len(engine.scheduler.waiting) == 1  # samples 1 and 2 wait for sample 0's prompt
    cached, finished = {}, []
    while engine.has_unfinished_requests():
        for output in engine.step():
            assert output.request_id == "r"
            (completion,) = output.outputs
            cached.setdefault(completion.index, output.num_cached_tokens)
            finished.append(output.finished)
        audit_blocks(engine)
    assert cached == {0: 0, 1: 32, 2: 32}
    assert finished.count(True) == 1 and finished[-1]
    assert_all_released(engine)


def test_aborting_the_request_aborts_every_sample_held_or_running(checkpoint, scheduling):
    engine = LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64))
    engine.add_request("r", PROMPT, SAMPLED.replace(n=3, max_tokens=50))
    # sample 0 computes the prompt; 1 and 2 join the step after its blocks are cached (async
    # scheduling: once that step is processed, one step later)
    for _ in range(3 if scheduling else 2):
        engine.step()
    assert engine.stats.num_running == 3
    assert engine.abort_request("r") == 3
    assert engine.step() == []
    assert_all_released(engine)
    engine.add_request("held", PROMPT, SAMPLED.replace(n=2))
    assert engine.abort_request("held") == 2
    assert engine.requests == {} and engine.step() == []
    assert_all_released(engine)


@pytest.mark.parametrize("taken", ["r", "1_r"])
def test_an_id_a_sample_would_take_is_refused(checkpoint, taken):
    engine = LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64))
    engine.add_request(taken, PROMPT, SAMPLED)
    with pytest.raises(ValueError) as error:
        engine.add_request("r", PROMPT, SAMPLED.replace(n=2))
    assert str(error.value) == f"request id {taken!r} is already in use"
    assert list(engine.requests) == [taken]
