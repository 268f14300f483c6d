"""Constrained decoding in the engine: the tiny model's text is random, so every valid
output here is the grammar masks' doing."""

import json
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jsonschema
import pytest
import xgrammar
from joined_outputs import JoinedOutputs

from kvserve import LLM, SamplingParams
from kvserve.engine.structured.compiler import GrammarCompiler
from kvserve.engine.structured.matcher import RequestGrammar
from kvserve.engine.structured.spec import OutputConstraint

from factories import finish_step, make_request, make_scheduler
from rank_counts import TENSOR_PARALLEL, TENSOR_PARALLEL_IDS

pytestmark = pytest.mark.usefixtures("scheduling")

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "status": {"enum": ["active", "deleted"]},
        "name": {"type": "string", "maxLength": 6},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["id", "status", "name", "tags"],
    "additionalProperties": False,
}
JSON = OutputConstraint("json", json.dumps(SCHEMA))
CHOICES = ("yes", "no", 'say "maybe"')


@pytest.fixture(scope="module", params=TENSOR_PARALLEL, ids=TENSOR_PARALLEL_IDS)
def llm(checkpoint, request, scheduling):
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=256, tensor_parallel_size=request.param)
    yield llm
    llm.engine.shutdown()


def texts(llm, params, n=4, prompt="def f(x):"):
    """``n`` completions of ``prompt``, sample ``i`` seeded with ``i``."""
    outputs = llm.generate([prompt] * n, [params.replace(seed=i) for i in range(n)])
    return [o.outputs[0] for o in outputs]


def valid_prefix(llm, constraint, token_ids) -> bool:
    matcher = xgrammar.GrammarMatcher(llm.engine.grammars.compile(constraint))
    return all(matcher.accept_token(t) for t in token_ids) and not matcher.is_terminated()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_outputs_validate_greedy_and_sampled(llm, temperature):
    params = SamplingParams(temperature=temperature, max_tokens=200, constraint=JSON)
    outs = texts(llm, params, prompt="x = ")
    for out in outs:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), SCHEMA)
        assert out.token_ids[-1] == llm.engine.tokenizer.eos_token_id
    if temperature:
        assert len({o.text for o in outs}) > 1


def test_unconstrained_text_is_not_json(llm):
    """The control: without the mask, the same model and prompt write no JSON."""
    out = texts(llm, SamplingParams(temperature=0, max_tokens=40), n=1, prompt="x = ")[0]
    with pytest.raises(ValueError):
        json.loads(out.text)


def test_choice_and_regex_are_exact(llm):
    params = SamplingParams(temperature=1.0, max_tokens=30)
    choice = OutputConstraint("choice", choices=CHOICES)
    outs = texts(llm, params.replace(constraint=choice), n=8)
    assert {o.text for o in outs} <= set(CHOICES)
    assert all(o.finish_reason == "stop" for o in outs)
    regex = OutputConstraint("regex", r"[a-c]{3}-\d{2}")
    for out in texts(llm, params.replace(constraint=regex), n=8):
        assert re.fullmatch(r"[a-c]{3}-\d{2}", out.text), out.text
        assert out.finish_reason == "stop"


def test_json_object_output_is_an_object(llm):
    any_object = OutputConstraint("json_object")
    outs = texts(llm, SamplingParams(max_tokens=40, constraint=any_object), n=6)
    for out in outs:
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict)
        else:
            assert valid_prefix(llm, any_object, out.token_ids)
    assert "stop" in {o.finish_reason for o in outs}
    empty = OutputConstraint("json", json.dumps({"type": "object", "maxProperties": 0}))
    assert texts(llm, SamplingParams(max_tokens=8, constraint=empty), n=1)[0].text == "{}"


def test_max_tokens_cuts_with_length_and_a_valid_prefix(llm):
    outs = texts(llm, SamplingParams(temperature=1.0, max_tokens=7, constraint=JSON))
    for out in outs:
        assert out.finish_reason == "length"
        assert len(out.token_ids) == 7
        assert valid_prefix(llm, JSON, out.token_ids)


def test_stop_strings_stop_ids_and_min_tokens_do_not_end_it_early(llm):
    tokenizer = llm.engine.tokenizer
    choice = OutputConstraint("choice", choices=("yes yes yes",))
    stop_ids = tuple(tokenizer.encode("yes"))
    params = SamplingParams(
        max_tokens=30, stop=["yes", " "], stop_token_ids=stop_ids, min_tokens=25,
        ignore_eos=True, constraint=choice,
    )  # fmt: skip
    out = texts(llm, params, n=1)[0]
    assert (out.text, out.finish_reason, out.stop_reason) == ("yes yes yes", "stop", None)


def test_constrained_and_plain_requests_share_a_step(llm, scheduling):
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = texts(llm, plain, n=1)[0]
    engine = llm.engine
    engine.grammars.compile(JSON)
    engine.add_request("c", "def f(x):", SamplingParams(max_tokens=200, constraint=JSON))
    engine.add_request("p", "def f(x):", plain)
    seen = JoinedOutputs()
    if scheduling:  # async: a step's tokens come out of the next call
        assert engine.step() == []
    outputs = {o.request_id: o for o in seen.add(engine.step())}
    assert set(outputs) == {"c", "p"}  # both sampled their first token in one step
    while engine.has_unfinished_requests():
        outputs |= {o.request_id: o for o in seen.add(engine.step())}
    assert outputs["p"].outputs[0].token_ids == alone.token_ids
    jsonschema.validate(json.loads(outputs["c"].outputs[0].text), SCHEMA)


def test_the_scheduler_passes_a_compiling_request_and_keeps_its_place():
    scheduler = make_scheduler()
    first, second, third = make_request(), make_request(), make_request()
    compiling: Future = Future()
    second.grammar = RequestGrammar(compiling)
    for request in (first, second, third):
        scheduler.add(request)
    out = scheduler.schedule()
    assert [(r, n) for r, n in out.scheduled] == [(first, 8), (third, 8)]
    assert list(scheduler.waiting) == [second]
    finish_step(scheduler, out)
    compiling.set_result(None)
    out = scheduler.schedule()
    assert [(r, n) for r, n in out.scheduled] == [(first, 1), (third, 1), (second, 8)]


def test_a_compiling_grammar_does_not_stall_the_others(llm, scheduling):
    engine = llm.engine
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    pool.submit(gate.wait)  # the pool's only worker is busy until the gate opens
    compiler = engine.grammars
    held = GrammarCompiler(engine.tokenizer, engine.model_config.vocab_size, (0,), pool)
    engine.grammars = engine.inputs.grammars = held  # the input processor submits compiles
    try:
        slow = OutputConstraint("regex", "[0-9]{4}")
        engine.add_request("slow", "a", SamplingParams(max_tokens=8, constraint=slow))
        engine.add_request("other", "b", SamplingParams(max_tokens=5, ignore_eos=True))
        finished, seen = {}, JoinedOutputs()
        for _ in range(6 if scheduling else 5):  # async: the 5th token comes out a call later
            finished |= {o.request_id: o for o in seen.add(engine.step()) if o.finished}
        assert finished["other"].outputs[0].finish_reason == "length"
        waiting = engine.requests["slow"]
        assert waiting.is_compiling and waiting.num_computed_tokens == 0
        assert waiting in engine.scheduler.waiting and not waiting.output_token_ids
        gate.set()
        while engine.has_unfinished_requests():
            finished |= {o.request_id: o for o in seen.add(engine.step()) if o.finished}
        assert re.fullmatch("[0-9]{4}", finished["slow"].outputs[0].text)
    finally:
        gate.set()
        engine.grammars = engine.inputs.grammars = compiler
        pool.shutdown()


def test_a_grammar_that_fails_to_compile_fails_only_its_request(llm):
    engine = llm.engine
    bad = OutputConstraint("json", json.dumps({"type": "frobnicate"}))
    engine.add_request("bad", "a", SamplingParams(max_tokens=4, constraint=bad))
    engine.add_request("good", "b", SamplingParams(max_tokens=3, ignore_eos=True))
    finished, seen = {}, JoinedOutputs()
    while engine.has_unfinished_requests():
        finished |= {o.request_id: o for o in seen.add(engine.step()) if o.finished}
    assert finished["bad"].outputs[0].finish_reason == "error"
    assert finished["bad"].outputs[0].token_ids == []
    assert len(finished["good"].outputs[0].token_ids) == 3
    assert engine.kv.usage == 0 and not engine.requests


def test_preemption_keeps_the_matcher_in_step(checkpoint):
    """Few blocks: requests are preempted and recomputed mid-output, and their greedy
    outputs equal those of a run without preemption."""
    model = str(checkpoint("llama"))
    params = SamplingParams(temperature=0, max_tokens=60, constraint=JSON)
    prompts = [f"def f{i}(x):" for i in range(6)]
    roomy = LLM(model, num_kv_blocks=256).generate(prompts, params)
    tight = LLM(model, num_kv_blocks=30, block_size=4, max_num_seqs=6)
    cramped = tight.generate(prompts, params)
    assert tight.engine.stats.num_preemptions > 0
    assert [o.outputs[0].text for o in cramped] == [o.outputs[0].text for o in roomy]
    for out in cramped:
        if out.outputs[0].finish_reason == "stop":
            jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
        else:
            assert valid_prefix(tight, JSON, out.outputs[0].token_ids)
