"""One request's data cannot break the engine: every numeric knob is bounded, and an
exception inside a step fails only the requests it belongs to, with every block freed."""

import pytest
from joined_outputs import JoinedOutputs

from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import EngineDeadError, LLMEngine
from kvserve.engine.sampling_params import SamplingParams

from faults import fail_on

NUM_BLOCKS = 64
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(checkpoint):
    return LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=NUM_BLOCKS))


@pytest.fixture(autouse=True)
def idle_after(engine):
    """Each test leaves the engine idle with every block free."""
    yield
    assert not engine.has_unfinished_requests()
    assert engine.requests == {}
    assert engine.kv.pool.num_free_blocks == NUM_BLOCKS
    assert (engine.stats.num_running, engine.stats.num_waiting, engine.kv.usage) == (0, 0, 0.0)


def run(engine: LLMEngine, requests: dict[str, tuple[str, SamplingParams]]) -> dict:
    """Add the requests, step until none is left; each one's final output."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    final, seen = {}, JoinedOutputs()
    for _ in range(100):
        if not engine.has_unfinished_requests():
            break
        for output in seen.add(engine.step()):
            if output.finished:
                final[output.request_id] = output.outputs[0]
    return final


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("top_k", 2**63, "in [-1, 2147483647]"),
        ("top_k", -2, "in [-1, 2147483647]"),
        ("seed", 2**64, "a 64-bit integer"),
        ("seed", -(2**63) - 1, "a 64-bit integer"),
        ("temperature", float("inf"), "finite and >= 0"),
        ("temperature", float("nan"), "finite and >= 0"),
        ("repetition_penalty", float("inf"), "finite and > 0"),
        ("repetition_penalty", 1e39, "finite and > 0"),
        ("logit_bias", {3: float("inf")}, "finite values"),
        ("top_p", float("nan"), "in (0, 1]"),
        ("min_p", 1.5, "in [0, 1]"),
        ("n", 0, ">= 1"),
        ("max_tokens", 0, ">= 1"),
        ("prompt_logprobs", -1, ">= 0"),
    ],
)
def test_every_numeric_field_is_bounded_and_named(field, value, rule):
    with pytest.raises(ValueError) as info:
        SamplingParams(**{field: value})
    assert str(info.value) == f"invalid {field}: {value!r} (must be {rule})"


def test_the_largest_accepted_values_run(engine):
    params = SamplingParams(
        temperature=1e-6,  # below GREEDY_TEMPERATURE: greedy, not a division by ~0
        top_k=2**31 - 1,
        seed=2**64 - 1,
        repetition_penalty=3e38,
        max_tokens=4,
        ignore_eos=True,
    )
    other = SamplingParams(temperature=0.8, top_p=0.5, seed=-(2**63), max_tokens=4, ignore_eos=True)
    final = run(engine, {"big": ("def f(x):", params), "other": ("import os", other)})
    assert [(o.finish_reason, len(o.token_ids)) for o in final.values()] == [("length", 4)] * 2
    assert params.greedy


def test_logprobs_beyond_the_vocabulary_are_refused_at_add(engine):
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"invalid {field}: 513 .must be at most the vocab"):
            engine.add_request("x", "hi", SamplingParams(**{field: 513}))
    assert engine.requests == {}


def test_a_sampling_failure_fails_only_the_request_it_comes_from(engine, monkeypatch):
    alone = run(engine, {"a": ("def f(x):", GREEDY), "c": ("x = 1", GREEDY)})
    marked = GREEDY.replace(max_tokens=7)
    failed = fail_on(
        monkeypatch,
        engine,
        "sampler",
        lambda _, requests: marked in [r.params for r in requests],
    )
    before = engine.stats.num_failed_steps
    final = run(engine, {"a": ("def f(x):", GREEDY), "b": ("pass", marked), "c": ("x = 1", GREEDY)})
    assert final["b"].finish_reason == "error"
    assert final["b"].token_ids == []
    assert final["a"].token_ids == alone["a"].token_ids
    assert final["c"].token_ids == alone["c"].token_ids
    assert (final["a"].finish_reason, final["c"].finish_reason) == ("length", "length")
    assert len(failed) == 2  # the batch, then b's own row
    assert engine.stats.num_failed_steps == before + 1


def test_a_batch_that_fails_only_as_a_batch_is_sampled_row_by_row(engine, monkeypatch):
    alone = run(engine, {"a": ("def f(x):", GREEDY), "b": ("pass", GREEDY)})
    failed = fail_on(monkeypatch, engine, "sampler", lambda _, requests: len(requests) > 1)
    before = engine.stats.num_failed_steps
    final = run(engine, {"a": ("def f(x):", GREEDY), "b": ("pass", GREEDY)})
    assert {k: v.token_ids for k, v in final.items()} == {k: v.token_ids for k, v in alone.items()}
    assert len(failed) == 6  # every step's batch, each recovered
    assert engine.stats.num_failed_steps == before


def test_a_stop_check_or_text_failure_fails_only_that_request(engine, monkeypatch):
    alone = run(engine, {"a": ("def f(x):", GREEDY)})
    engine.add_request("a", "def f(x):", GREEDY)
    engine.add_request("b", "pass", GREEDY)
    engine.add_request("c", "x = 1", GREEDY)
    fail_on(monkeypatch, engine.requests["b"].detokenizer, "update", lambda *_: True)
    fail_on(monkeypatch, engine.requests["c"].detokenizer, "take", lambda *_: True)
    final = run(engine, {})
    assert (final["b"].finish_reason, final["c"].finish_reason) == ("error", "error")
    assert final["a"].token_ids == alone["a"].token_ids
    assert final["a"].text == alone["a"].text


def test_a_failed_forward_fails_its_step_and_the_engine_goes_on(engine, monkeypatch):
    engine.add_request("a", "def f(x):", GREEDY)
    engine.add_request("b", "pass", GREEDY)
    engine.step()
    before = engine.stats.num_failed_steps
    failed = fail_on(monkeypatch, engine.runner, "execute", lambda *_: not failed)
    outputs = engine.step()
    assert [(o.request_id, o.finished, o.outputs[0].finish_reason) for o in outputs] == [
        ("a", True, "error"),
        ("b", True, "error"),
    ]
    assert [o.outputs[0].num_output_tokens for o in outputs] == [1, 1]
    assert engine.stats.num_failed_steps == before + 1
    assert engine.kv.pool.num_free_blocks == NUM_BLOCKS
    final = run(engine, {"c": ("def f(x):", GREEDY)})
    assert final["c"].finish_reason == "length"


def test_failed_forwards_in_a_row_declare_the_engine_dead(checkpoint, monkeypatch):
    engine = LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=NUM_BLOCKS))
    fail_on(monkeypatch, engine.runner, "execute", lambda *_: True)
    for i in range(2):
        engine.add_request(str(i), "def f(x):", GREEDY)
        assert [o.outputs[0].finish_reason for o in engine.step()] == ["error"]
    engine.add_request("2", "def f(x):", GREEDY)
    with pytest.raises(EngineDeadError, match="3 steps in a row failed"):
        engine.step()
    assert engine.kv.pool.num_free_blocks == NUM_BLOCKS
    assert engine.requests == {}
