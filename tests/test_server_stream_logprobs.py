"""Streamed log-probabilities are the non-streamed ones, token for token, also where a
token's text is empty (a byte inside a multi-byte character): the tiny checkpoint's
byte-level tokenizer, with random weights, produces many of those."""

import openai
import pytest
from transformers import AutoTokenizer

from server_process import API_KEY, ServerProcess

PROMPT = "def split(text, sep):\n    return"
MESSAGES = [{"role": "user", "content": "hello"}]
PARTIAL = "\ufffd"  # what a lone byte of a multi-byte character decodes to


@pytest.fixture(scope="module")
def prompt_len(checkpoint) -> int:
    return len(AutoTokenizer.from_pretrained(checkpoint("llama")).encode(PROMPT))


@pytest.fixture(scope="module")
def client(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    # Without prefix caching every request computes its prompt alike: the same values, exactly.
    args = ("--num-kv-blocks", "256", "--no-enable-prefix-caching")
    with ServerProcess(checkpoint("llama"), *args, log=log) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def _joined(pieces: list) -> dict:
    """The logprobs of streamed completion chunks, concatenated field by field."""
    joined: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for piece in pieces:
        for key, values in joined.items():
            values.extend(getattr(piece, key))
    return joined


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_completion_logprobs_equal_the_whole_ones(client, prompt_len, echo):
    kwargs = dict(
        model="tiny",
        prompt=PROMPT,
        max_tokens=200,
        temperature=0,
        logprobs=2,
        echo=echo,
        extra_body={"ignore_eos": True},
    )
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(**kwargs, stream=True))
    expected = whole.logprobs.model_dump()
    assert len(expected["tokens"]) == 200 + (prompt_len if echo else 0)
    assert sum(PARTIAL in token for token in expected["tokens"]) >= 20
    assert _joined([c.choices[0].logprobs for c in chunks]) == expected
    assert "".join(c.choices[0].text for c in chunks) == whole.text


def test_streamed_chat_logprobs_equal_the_whole_ones(client):
    kwargs = dict(
        model="tiny",
        messages=MESSAGES,
        max_tokens=100,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    expected = [item.model_dump() for item in whole.logprobs.content]
    assert len(expected) == 100
    assert sum(PARTIAL in item["token"] for item in expected) >= 10
    streamed = [
        item.model_dump()
        for c in chunks
        if c.choices[0].logprobs
        for item in c.choices[0].logprobs.content
    ]
    assert streamed == expected
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.message.content
