"""N-gram speculative decoding in the engine: every request outputs exactly what it outputs
without speculation (greedy, seeded sampling with penalties and logit bias, logprobs,
structured outputs), in fewer, longer deltas, and a stop inside an accepted run of drafts
cuts there: nothing after it."""

import itertools
import json

import pytest

from kvserve import SamplingParams
from kvserve.engine.host_copy import HostCopies
from kvserve.engine.llm import LLM
from kvserve.engine.structured.spec import OutputConstraint

from audit import assert_all_released

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
# prompts that repeat themselves (drafts found and accepted) and ones that do not
PROMPTS = [
    [11, 12, 13, 14, 15] * 4,
    [300, 301, 302],
    [7, 8, 9, 10, 7, 8, 9, 10, 7],
    list(range(40, 70)),
]


@pytest.fixture(scope="module")
def llms(checkpoint):
    path = str(checkpoint("llama"))
    settings = {"dtype": "float32", "num_kv_blocks": 128, "block_size": 4}
    plain = LLM(path, **settings)
    spec = LLM(path, speculative_config=NGRAM, **settings)
    yield plain, spec
    plain.engine.shutdown()
    spec.engine.shutdown()


def deltas(llm, prompt, params):
    """The request's deltas, one ``engine.step`` at a time."""
    engine = llm.engine
    engine.add_request("r", prompt, params)
    seen = []
    while engine.has_unfinished_requests():
        seen += [o.outputs[0] for o in engine.step()]
    assert_all_released(engine)
    return seen


def assert_logprobs_close(got, expected):
    """The same tokens and alternatives; the values as close as float32 sums in another order
    (a verification step computes several positions of a request at once)."""
    if expected is None:
        assert got is None
        return
    assert [(lp.token_id, [t for t, _ in lp.top]) for lp in got] == [
        (lp.token_id, [t for t, _ in lp.top]) for lp in expected
    ]
    values = [v for lp in got for v in (lp.logprob, *(v for _, v in lp.top))]
    wanted = [v for lp in expected for v in (lp.logprob, *(v for _, v in lp.top))]
    assert values == pytest.approx(wanted, abs=1e-4)


def test_greedy_and_seeded_outputs_are_the_same_with_speculation(llms):
    plain, spec = llms
    params = [
        SamplingParams(max_tokens=48, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, logprobs=2),
        SamplingParams(
            max_tokens=48,
            temperature=0.3,
            seed=5,
            ignore_eos=True,
            repetition_penalty=1.1,
            frequency_penalty=0.2,
            logit_bias={13: 1.5},
            logprobs=1,
        ),
        SamplingParams(max_tokens=48, temperature=0.8, top_k=8, seed=9, min_tokens=40),
    ]
    before = spec.engine.speculator.stats.num_accepted_tokens
    for p in params:
        expected = plain.generate(PROMPTS, p)
        got = spec.generate(PROMPTS, p)
        for a, b in zip(expected, got, strict=True):
            assert b.outputs[0].token_ids == a.outputs[0].token_ids
            assert b.outputs[0].text == a.outputs[0].text
            assert_logprobs_close(b.outputs[0].logprobs, a.outputs[0].logprobs)
    stats = spec.engine.speculator.stats
    assert stats.num_accepted_tokens > before
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_structured_outputs_are_the_same_with_speculation(llms):
    plain, spec = llms
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = OutputConstraint("json", json.dumps(schema))
    for temperature in (0.0, 1.0):
        p = SamplingParams(max_tokens=60, temperature=temperature, seed=3, constraint=constraint)
        expected = plain.generate(PROMPTS, p)
        got = spec.generate(PROMPTS, p)
        for a, b in zip(expected, got, strict=True):
            assert b.outputs[0].token_ids == a.outputs[0].token_ids
            assert b.outputs[0].finish_reason == a.outputs[0].finish_reason
            if a.outputs[0].finish_reason == "stop":
                json.loads(b.outputs[0].text)


def test_a_stop_inside_an_accepted_run_cuts_there(llms):
    plain, spec = llms
    prompt = PROMPTS[0]
    free = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    pieces = deltas(spec, prompt, free)
    tokens = [t for piece in pieces for t in piece.token_ids]
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + len(piece.token_ids))
    # the first token followed by another in the same delta: an accepted draft's place
    stop_at = next(
        start for piece, start in zip(pieces, starts, strict=False) if len(piece.token_ids) > 1
    )
    got = deltas(spec, prompt, free.replace(max_tokens=stop_at + 1))
    assert [t for piece in got for t in piece.token_ids] == tokens[: stop_at + 1]
    assert got[-1].finish_reason == "length"
    assert all(piece.finish_reason is None for piece in got[:-1])
    text = plain.get_tokenizer().decode(tokens[: stop_at + 1])
    params = free.replace(stop=[text[-2:]])
    expected = plain.generate(prompt, params)[0].outputs[0]
    got = deltas(spec, prompt, params)
    assert [t for piece in got for t in piece.token_ids] == expected.token_ids
    assert "".join(piece.text for piece in got) == expected.text
    assert got[-1].finish_reason == "stop" and got[-1].stop_reason == text[-2:]


def test_an_aborted_request_says_nothing_more(llms):
    _, spec = llms
    engine = spec.engine
    engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=40, temperature=0))
    engine.add_request("b", PROMPTS[2], SamplingParams(max_tokens=40, temperature=0))
    while not any(len(o.outputs[0].token_ids) > 1 for o in engine.step()):
        pass
    engine.abort_request("a")
    while engine.has_unfinished_requests():
        assert all(o.request_id == "b" for o in engine.step())
    assert_all_released(engine)


@pytest.mark.parametrize("parallel", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_two_ranks_verify_drafts_as_one(checkpoint, llms, parallel):
    """Tensor parallelism: the verification step's inputs go to both ranks like any step's;
    pipeline stages: its micro-batches keep their requests' drafts and draft rows."""
    plain, _ = llms
    tp2 = LLM(
        str(checkpoint("llama")),
        dtype="float32",
        num_kv_blocks=128,
        block_size=4,
        speculative_config=NGRAM,
        **{parallel: 2},
    )
    try:
        for p in (
            SamplingParams(max_tokens=32, temperature=0, ignore_eos=True),
            SamplingParams(max_tokens=32, temperature=0.5, seed=4, ignore_eos=True),
        ):
            expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, p)]
            assert [o.outputs[0].token_ids for o in tp2.generate(PROMPTS, p)] == expected
        assert tp2.engine.speculator.stats.num_accepted_tokens > 0
    finally:
        tp2.engine.shutdown()


def test_prompt_logprobs_share_a_step_with_drafts(llms):
    """A prompt's logprob rows come after the drafts' rows of the requests decoding beside it."""
    plain, spec = llms
    greedy = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    scored = greedy.replace(prompt_logprobs=2, max_tokens=4)
    engine = spec.engine
    engine.add_request("a", PROMPTS[0], greedy)
    seen: dict[str, list] = {"a": [], "b": []}
    while engine.has_unfinished_requests():
        shared = (
            "b" not in engine.requests and not seen["b"] and engine.requests["a"].spec_token_ids
        )
        if shared:  # b's prompt is computed in the step that verifies a's drafts
            engine.add_request("b", PROMPTS[3], scored)
        before = engine.speculator.stats.num_drafts
        for out in engine.step():
            seen[out.request_id].append(out)
        assert not shared or engine.speculator.stats.num_drafts == before + 1
    assert_all_released(engine)
    a, b = plain.generate([PROMPTS[0], PROMPTS[3]], [greedy, scored])
    assert [t for o in seen["a"] for t in o.outputs[0].token_ids] == a.outputs[0].token_ids
    assert [t for o in seen["b"] for t in o.outputs[0].token_ids] == b.outputs[0].token_ids
    got = seen["b"][0].prompt_logprobs
    assert got[0] is None and b.prompt_logprobs[0] is None
    assert_logprobs_close(got[1:], b.prompt_logprobs[1:])


def test_a_greedy_verification_step_copies_to_the_host_once(llms):
    """Plain greedy requests verify all their drafts with one argmax and one copy a step."""
    plain, spec = llms
    engine = spec.engine
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, greedy)
    at_each_run: list[int] = []
    run = engine.runner.run
    before = engine.speculator.stats.num_drafts

    def counted(inputs):
        at_each_run.append(HostCopies.count)
        return run(inputs)

    engine.runner.run = counted
    got: dict[str, list[int]] = {str(i): [] for i in range(len(PROMPTS))}
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                got[out.request_id] += out.outputs[0].token_ids
    finally:
        del engine.runner.run
    at_each_run.append(HostCopies.count)
    assert_all_released(engine)
    assert [b - a for a, b in itertools.pairwise(at_each_run)] == [1] * (len(at_each_run) - 1)
    assert engine.speculator.stats.num_drafts - before >= 5
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, greedy)]
    assert list(got.values()) == expected
