"""The scheduler's stop-string decision comes from the request, built with its text (a real
detokenizer over the tiny checkpoint's tokenizer): a stop string ends it once
``min_tokens`` are out; a request of token ids only has no stop string."""

import pytest
from transformers import AutoTokenizer

from kvserve.engine.core.request import Request
from kvserve.engine.detokenizer import Detokenizer
from kvserve.engine.sampling_params import SamplingParams

from factories import make_scheduler


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return AutoTokenizer.from_pretrained(checkpoint("llama"))


def run(tokenizer, request: Request, text: str) -> Request:
    """Schedule ``request`` and feed it the tokens of ``text`` one step at a time."""
    s = make_scheduler()
    s.add(request)
    for token in tokenizer.encode(text):
        out = s.schedule()
        s.update(out, [token] * len(out.sampling_requests), eos_token_ids=set())
        if request.is_finished:
            break
    return request


def with_text(tokenizer, stop: str, **params) -> Request:
    prompt = tokenizer.encode("say: ")
    params = SamplingParams(temperature=0, max_tokens=64, stop=[stop], **params)
    detokenizer = Detokenizer(tokenizer, prompt, params.stop)
    return Request("r", prompt, params, detokenizer=detokenizer)


def test_a_stop_string_in_the_text_ends_the_request(tokenizer):
    request = run(tokenizer, with_text(tokenizer, "there"), "hello there and more")
    assert (request.finish_reason, request.stop_reason) == ("stop", "there")
    assert tokenizer.decode(request.output_token_ids).startswith("hello there")
    assert not tokenizer.decode(request.output_token_ids[:-1]).startswith("hello there")


def test_a_stop_string_before_min_tokens_does_not_count(tokenizer):
    text = "hello there and more"
    request = run(tokenizer, with_text(tokenizer, "there", min_tokens=32), text)
    assert (request.is_finished, request.output_token_ids) == (False, tokenizer.encode(text))


def test_a_request_of_token_ids_only_has_no_stop_string(tokenizer):
    prompt = tokenizer.encode("say: ")
    params = SamplingParams(temperature=0, max_tokens=64, stop=["there"])
    request = run(tokenizer, Request("r", prompt, params), "hello there and more")
    assert (request.finish_reason, request.is_finished) == (None, False)
