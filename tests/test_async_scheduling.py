"""Async scheduling (``--async-scheduling``): step N+1 runs with step N's tokens fed on the
device, yet every request gets the tokens synchronous scheduling gives it; one that ends in
step N (a stop token or string, ``max_tokens``, an abort) emits nothing from step N+1, whose
row for it is thrown away; and every block is accounted for after every step."""

import pytest
from joined_outputs import JoinedOutputs

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine

from audit import assert_all_released, audit_blocks

PROMPTS = {"f": [5, 9, 33, 70, 12, 41], "o": [7, 8, 9, 10, 11, 12, 13, 14, 15]}
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def build(path: str, async_scheduling: bool) -> LLMEngine:
    config = EngineConfig(
        model=path, num_kv_blocks=64, block_size=4, async_scheduling=async_scheduling
    )
    return LLMEngine(config)


def run_requests(
    engine: LLMEngine, params: dict[str, SamplingParams], abort_after: int | None = None
):
    """Step the requests to the end, auditing the blocks after every step; their joined
    outputs, and for each the steps in flight that still held it after its final output."""
    for request_id, p in params.items():
        engine.add_request(request_id, PROMPTS[request_id], p)
    seen, final, late = JoinedOutputs(), {}, {request_id: 0 for request_id in params}
    calls = 0
    while engine.has_unfinished_requests():
        for out in seen.add(engine.step()):
            assert out.request_id not in final, "an output after the final one"
            if out.finished:
                final[out.request_id] = out
        calls += 1
        if calls == abort_after:
            assert engine.abort_request("f") == 1
            final["f"] = None
        audit_blocks(engine)
        in_flight = engine._async.in_flight if engine._async is not None else None
        if in_flight is not None:
            for request, _ in in_flight.out.scheduled:
                if request.request_id in final:
                    late[request.request_id] += 1
    assert_all_released(engine)
    return final, late


def tokens(final: dict) -> dict:
    return {k: None if v is None else v.outputs[0].token_ids for k, v in final.items()}


def test_greedy_seeded_and_logprob_requests_get_the_synchronous_tokens(checkpoint):
    path = str(checkpoint("llama"))
    params = {
        "f": SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=3, max_tokens=9, logprobs=2),
        "o": GREEDY.replace(logprobs=1),
    }
    sync, _ = run_requests(build(path, False), params)
    got, _ = run_requests(build(path, True), params)
    assert tokens(got) == tokens(sync)
    for request_id in params:
        ours, theirs = got[request_id].outputs[0].logprobs, sync[request_id].outputs[0].logprobs
        assert ours == theirs


@pytest.mark.parametrize("reason", ["length", "stop string", "stop token"])
def test_a_request_ending_in_step_n_emits_nothing_from_step_n_plus_1(checkpoint, reason):
    path = str(checkpoint("llama"))
    reference, _ = run_requests(build(path, False), {"f": GREEDY, "o": GREEDY})
    ids = reference["f"].outputs[0].token_ids
    ends = {
        "length": GREEDY.replace(max_tokens=4),
        "stop string": GREEDY.replace(stop=[reference["f"].outputs[0].text[6:9]]),
        "stop token": GREEDY.replace(stop_token_ids=[ids[4]]),
    }
    params = {"f": ends[reason], "o": GREEDY}
    sync, _ = run_requests(build(path, False), params)
    got, late = run_requests(build(path, True), params)
    assert tokens(got) == tokens(sync)
    assert got["f"].outputs[0].finish_reason == ("length" if reason == "length" else "stop")
    assert len(got["f"].outputs[0].token_ids) < len(ids)
    assert late == {"f": 1, "o": 0}  # one thrown-away row, in the step after its end


def test_an_aborted_request_emits_nothing_more_and_its_blocks_come_back(checkpoint):
    path = str(checkpoint("llama"))
    sync, _ = run_requests(build(path, False), {"o": GREEDY})
    got, late = run_requests(build(path, True), {"f": GREEDY, "o": GREEDY}, abort_after=3)
    assert got["f"] is None and tokens(got)["o"] == tokens(sync)["o"]
    assert late["f"] == 1  # the step in flight when it was aborted


def test_penalised_requests_do_not_sync_their_step(checkpoint):
    """Penalties and ``min_tokens`` read the history on the device: the step after one that
    ends a penalised request is in flight before it is processed (one thrown-away row)."""
    path = str(checkpoint("llama"))
    params = {
        "f": GREEDY.replace(max_tokens=4, repetition_penalty=1.3, presence_penalty=0.5),
        "o": GREEDY.replace(frequency_penalty=0.7, min_tokens=3),
    }
    sync, _ = run_requests(build(path, False), params)
    got, late = run_requests(build(path, True), params)
    assert tokens(got) == tokens(sync)
    assert late == {"f": 1, "o": 0}


def test_a_failed_forward_fails_its_step_and_the_one_queued_behind_it(checkpoint, monkeypatch):
    """The queued step's placeholders can never be filled: its requests fail too, every
    block comes back, and the engine goes on."""
    engine = build(str(checkpoint("llama")), True)
    for request_id, prompt in PROMPTS.items():
        engine.add_request(request_id, prompt, GREEDY)
    engine.step()
    engine.step()  # the prefill's tokens out; the first decode step in flight
    assert engine._async is not None and engine._async.in_flight is not None
    engine._async.in_flight.result.result()  # it ran: the next step is the one that fails
    run = engine.runner.run
    calls = []

    def fails_once(inputs):
        calls.append(inputs)
        if len(calls) == 1:
            raise RuntimeError("injected failure in run")
        return run(inputs)

    monkeypatch.setattr(engine.runner, "run", fails_once)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
        audit_blocks(engine)
    assert [(o.request_id, o.finished, o.outputs[0].finish_reason) for o in outputs] == [
        ("f", False, None),  # the first decode step's tokens
        ("o", False, None),
        ("f", True, "error"),
        ("o", True, "error"),
    ]
    assert engine.stats.num_failed_steps == 1  # the step behind it never ran
    assert_all_released(engine)
    final, _ = run_requests(engine, {"f": GREEDY})
    assert final["f"].outputs[0].finish_reason == "length"


def test_speculative_decoding_keeps_async_scheduling_off_with_a_warning(checkpoint, caplog):
    config = EngineConfig(
        model=str(checkpoint("llama")),
        num_kv_blocks=64,
        block_size=4,
        async_scheduling=True,
        speculative_config={"method": "ngram", "num_speculative_tokens": 2},
    )
    with caplog.at_level("WARNING", logger="kvserve.engine.llm_engine"):
        engine = LLMEngine(config)
    assert engine._async is None
    assert "async scheduling is off: speculative_config does not run with it" in caplog.text
    final, _ = run_requests(engine, {"o": GREEDY})
    engine.shutdown()
    sync = build(config.model, async_scheduling=False)
    expected, _ = run_requests(sync, {"o": GREEDY})
    sync.shutdown()
    assert tokens(final) == tokens(expected)
