"""Penalties and ``min_tokens`` through the engine, with async scheduling off and on: every
kind, greedy and seeded, in one mixed batch, gives exactly the tokens of the host-list
formula run with synchronous steps; under block pressure (preemptions) and aborts the
history slots are held only by running requests and all come back."""

import pytest
from joined_outputs import JoinedOutputs
from penalty_reference import host_list_logits

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine

from audit import assert_all_released, audit_blocks

pytestmark = pytest.mark.usefixtures("scheduling")

PROMPT = [5, 9, 33, 70, 12, 41, 5, 9]
KINDS = {
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=1.2),
    "repetition": dict(repetition_penalty=1.8),
    "all": dict(presence_penalty=0.4, frequency_penalty=0.6, repetition_penalty=1.3),
}
MODES = {
    "greedy": SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
    "seeded": SamplingParams(temperature=0.9, top_k=30, seed=5, max_tokens=14, ignore_eos=True),
}


def build(path: str, **limits) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, block_size=4, **({"num_kv_blocks": 64} | limits)))


def host_list_engine(path: str) -> LLMEngine:
    """Synchronous steps, the sampler's adjustments from the host's token lists."""
    engine = build(path)
    engine.set_async_scheduling(False)
    sampler = engine.sampler
    sampler.adjust_logits = lambda logits, requests, rows=None: host_list_logits(  # type: ignore[method-assign]
        logits, requests, sampler.eos_token_ids
    )
    return engine


def run(engine: LLMEngine, params: dict[str, SamplingParams], abort: str | None = None):
    """Each request's token ids (None: aborted after the third step), auditing every step."""
    for request_id, p in params.items():
        engine.add_request(request_id, PROMPT, p)
    seen, final, steps = JoinedOutputs(), {}, 0
    while engine.has_unfinished_requests():
        for out in seen.add(engine.step()):
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
        steps += 1
        if abort is not None and steps == 3:
            assert engine.abort_request(abort) == 1
            final[abort] = None
        audit_blocks(engine)
    assert_all_released(engine)
    return final


@pytest.mark.parametrize("mode", MODES)
def test_every_penalty_kind_and_min_tokens_match_the_host_list_formula(checkpoint, mode):
    path = str(checkpoint("llama"))
    plain = MODES[mode]
    reference = host_list_engine(path)
    unpenalised = run(reference, {"plain": plain})["plain"]
    params = {kind: plain.replace(**changes) for kind, changes in KINDS.items()}
    # stopping on its second token, unless min_tokens holds it back
    params["min_tokens"] = plain.replace(min_tokens=6, stop_token_ids=(unpenalised[1],))
    params["plain"] = plain
    expected = run(reference, params)
    assert all(expected[kind] != unpenalised for kind in params if kind != "plain")
    assert len(expected["min_tokens"]) >= 6
    assert run(build(path), params) == expected


def test_history_slots_follow_preemptions_and_aborts(checkpoint):
    path = str(checkpoint("llama"))
    params = {
        f"{kind}-{mode}": plain.replace(max_tokens=24, **changes)
        for kind, changes in KINDS.items()
        for mode, plain in MODES.items()
    }
    expected = run(host_list_engine(path), params)
    pressed = build(path, num_kv_blocks=24, max_num_batched_tokens=16)
    assert run(pressed, params) == expected
    assert pressed.stats.num_preemptions > 0
    aborted = run(pressed, params, abort="all-greedy")
    assert aborted == expected | {"all-greedy": None}
