"""The grammar compiler's cache and errors, and the batched mask in the sampler."""

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import xgrammar

from kvserve.engine.sampler import Sampler
from kvserve.engine.structured.compiler import GrammarCompiler, InvalidConstraintError
from kvserve.engine.structured.matcher import RequestGrammar
from kvserve.engine.structured.spec import OutputConstraint
from kvserve.server.structured import check_compiles

from checkpoints import VOCAB_SIZE, trained_tokenizer
from factories import make_request


@pytest.fixture(scope="module")
def tokenizer():
    return trained_tokenizer()


@pytest.fixture
def compiler(tokenizer):
    grammars = GrammarCompiler(tokenizer, VOCAB_SIZE, (tokenizer.eos_token_id,))
    yield grammars
    grammars.shutdown()


def accepts(compiler, constraint, text) -> bool:
    """Whether the grammar takes ``text`` (byte by byte) and may end after it."""
    matcher = xgrammar.GrammarMatcher(compiler.compile(constraint))
    return matcher.accept_string(text) and matcher.is_completed()


def test_equal_constraints_compile_once_and_share_the_future(tokenizer):
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    pool.submit(gate.wait)
    compiler = GrammarCompiler(tokenizer, VOCAB_SIZE, (0,), pool)
    first = compiler.submit(OutputConstraint("regex", "a+"))
    assert not first.done()  # queued behind the gate: submit never blocks
    assert compiler.submit(OutputConstraint("regex", "a+")) is first
    assert compiler.submit(OutputConstraint("regex", "b+")) is not first
    gate.set()
    assert compiler.compile(OutputConstraint("regex", "a+")) is first.result()
    pool.shutdown()


def test_choice_literals_are_escaped(compiler):
    choices = ('say "hi"', "back\\slash", "naïve ✓", "new\nline")
    constraint = OutputConstraint("choice", choices=choices)
    assert all(accepts(compiler, constraint, c) for c in choices)
    assert not accepts(compiler, constraint, "say")


def test_bounded_strings_refuse_raw_control_characters(compiler):
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}}
    constraint = OutputConstraint("json", json.dumps(schema))
    assert accepts(compiler, constraint, '{"s": "ab"}')
    assert not accepts(compiler, constraint, '{"s": "a\x0eb"}')
    assert not accepts(compiler, constraint, '{"s": "abcde"}')


def byte_token_ids(tokenizer, raw: bytes) -> list[int]:
    """The single-byte tokens spelling ``raw`` in a byte-level BPE (GPT-2's byte map)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    unprintable = [b for b in range(256) if b not in printable]
    char = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(unprintable)}
    return tokenizer.convert_tokens_to_ids([char[b] for b in raw])


def test_strings_refuse_utf16_surrogates(compiler, tokenizer):
    """The three bytes of U+DD88 (valid WTF-8, not UTF-8) in a bounded and a free string."""
    strings = [{"type": "string", "maxLength": 3}, {"type": "string"}]
    schema = {"type": "array", "prefixItems": strings, "items": False}
    grammar = compiler.compile(OutputConstraint("json", json.dumps(schema)))
    for prefix in (b'["', b'["a", "'):
        matcher = xgrammar.GrammarMatcher(grammar)
        assert all(matcher.accept_token(t) for t in byte_token_ids(tokenizer, prefix))
        assert all(matcher.accept_token(t) for t in byte_token_ids(tokenizer, b"\xc3\xa9"))
        assert matcher.accept_token(byte_token_ids(tokenizer, b"\xed")[0])  # U+D000-U+DFFF
        assert not matcher.accept_token(byte_token_ids(tokenizer, b"\xb6")[0])  # a surrogate


def test_json_is_compact_and_json_object_is_an_object(compiler):
    assert accepts(compiler, OutputConstraint("json_object"), '{"a": [1, {"b": null}]}')
    assert not accepts(compiler, OutputConstraint("json_object"), "[1]")
    assert not accepts(compiler, OutputConstraint("json_object"), '{ "a": 1}')


@pytest.mark.parametrize(
    "constraint, message",
    [
        (
            OutputConstraint("json", "{"),
            "invalid json schema: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
        (OutputConstraint("json", '{"type": 5}'), "invalid json schema: Type should be a string"),
        (
            OutputConstraint("regex", "(a"),
            "invalid regex: Regex parsing error at position 3: The parenthesis is not closed.",
        ),
        (
            OutputConstraint("grammar", "root ::= x"),
            'invalid grammar: EBNF parser error at line 1, column 10: Rule "x" is not defined',
        ),
        (
            OutputConstraint("choice", choices=("a", "")),
            "invalid choice: must be a non-empty list of non-empty strings",
        ),
        (
            OutputConstraint("json", '{"properties": {"not": {"not": {"type": "null"}}}}'),
            "invalid json schema: unsupported keyword 'not' at /properties/not/not",
        ),
        (
            OutputConstraint("json", '{"items": {"enum": [{"if": 1}], "uniqueItems": true}}'),
            "invalid json schema: unsupported keyword 'uniqueItems' at /items/uniqueItems",
        ),
        (
            OutputConstraint("json", '{"anyOf": [{}, {"allOf": [{}, {}]}]}'),
            "invalid json schema: unsupported keyword 'allOf' with more than one subschema "
            "at /anyOf/1/allOf",
        ),
    ],
)
def test_errors_name_the_problem_and_are_cached(compiler, constraint, message):
    with pytest.raises(InvalidConstraintError) as info:
        compiler.compile(constraint)
    assert str(info.value) == message
    assert compiler.submit(constraint).exception() is info.value


def test_the_sampler_masks_only_constrained_rows(compiler, tokenizer):
    digits = OutputConstraint("regex", "[0-9]")
    allowed = {t for t in range(VOCAB_SIZE) if tokenizer.decode([t]) in set("0123456789")}
    rows = [make_request(), make_request(logprobs=0), make_request(temperature=1.0, seed=4)]
    rows[1].grammar = RequestGrammar(compiler.submit(digits))
    rows[2].grammar = RequestGrammar(compiler.submit(digits))
    logits = torch.randn(3, VOCAB_SIZE)
    raw = logits.clone()
    out = Sampler([0])(logits, rows)
    assert out.token_ids[0] == int(raw[0].argmax())
    assert out.token_ids[1] == max(allowed, key=lambda t: raw[1, t])
    assert out.token_ids[2] in allowed
    assert torch.equal(logits, raw)  # logprobs are asked for: the raw logits stay as they were
    chosen = out.token_ids[1]
    assert out.logprobs[1].logprob == pytest.approx(float(raw[1].log_softmax(0)[chosen]))


def test_eos_is_allowed_only_where_the_grammar_may_end(compiler, tokenizer):
    eos = tokenizer.eos_token_id
    request = make_request()
    request.grammar = RequestGrammar(compiler.submit(OutputConstraint("regex", "[0-9]")))
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, eos] = 100.0  # the model wants to stop at once
    token = Sampler([eos])(logits, [request]).token_ids[0]
    assert tokenizer.decode([token]) in set("0123456789")
    request.grammar.accept(token)
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, token] = 100.0  # now it wants another digit, which the grammar refuses
    assert Sampler([eos])(logits, [request]).token_ids[0] == eos
    request.grammar.accept(eos)
    assert request.grammar.is_terminated


def test_a_client_that_leaves_does_not_cancel_the_cached_compile(tokenizer):
    gate = threading.Event()
    pool = ThreadPoolExecutor(1)
    pool.submit(gate.wait)
    compiler = GrammarCompiler(tokenizer, VOCAB_SIZE, (0,), pool)
    constraint = OutputConstraint("regex", "x+")

    async def leave() -> None:
        task = asyncio.create_task(check_compiles(compiler, constraint, "guided_regex"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave())
    gate.set()
    assert compiler.compile(constraint) is not None  # not cancelled: still cached, compiled
    pool.shutdown()
