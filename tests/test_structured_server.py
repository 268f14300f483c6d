"""Structured outputs through a real ``kvserve serve``, driven by the official SDK: the tiny
model writes random text, so every valid output is the grammar masks' doing."""

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from rank_counts import TENSOR_PARALLEL, TENSOR_PARALLEL_IDS
from server_process import API_KEY, ServerProcess

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Tokyo", "Lima"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 9999},
        "coastal": {"type": "boolean"},
        "nickname": {"type": "string", "maxLength": 8},
        "districts": {
            "type": "array",
            "items": {"anyOf": [{"type": "integer", "maximum": 99}, {"enum": ["north"]}]},
            "maxItems": 2,
        },
    },
    "required": ["city", "population", "coastal", "nickname", "districts"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
}
MESSAGES = [{"role": "user", "content": "Describe a city."}]


class City(BaseModel):
    name: Literal["Paris", "Tokyo"]
    rank: int = Field(ge=1, le=50)
    capital: bool
    motto: str = Field(max_length=6)


@pytest.fixture(scope="module", params=TENSOR_PARALLEL, ids=TENSOR_PARALLEL_IDS)
def server(checkpoint, tmp_path_factory, request):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ("--num-kv-blocks", "256", "--tensor-parallel-size", str(request.param))
    with ServerProcess(checkpoint("llama"), *args, log=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def test_chat_json_schema_n_samples_all_validate(client):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT, n=3,
        temperature=1.0, seed=7, max_completion_tokens=200,
    )  # fmt: skip
    contents = [c.message.content for c in response.choices]
    for choice in response.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert len(set(contents)) > 1


def test_sdk_parse_returns_the_pydantic_object(client):
    completion = client.chat.completions.parse(
        model="tiny", messages=MESSAGES, response_format=City, max_completion_tokens=200
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, City)
    assert message.parsed == City.model_validate_json(message.content)


def test_streamed_json_schema_deltas_join_to_valid_json(client):
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format=RESPONSE_FORMAT, stream=True, n=2,
        temperature=1.0, seed=3, max_completion_tokens=200,
    )  # fmt: skip
    texts, finish = ["", ""], [None, None]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finish[choice.index] = choice.finish_reason or finish[choice.index]
    assert finish == ["stop", "stop"]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_response_format(client):
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format={"type": "json_object"}, n=4,
        temperature=1.0, seed=1, max_completion_tokens=60,
    )  # fmt: skip
    finished = [c.message.content for c in response.choices if c.finish_reason == "stop"]
    assert finished and all(isinstance(json.loads(text), dict) for text in finished)


def test_text_response_format_is_unconstrained(client):
    args = dict(model="tiny", messages=MESSAGES, temperature=0, max_completion_tokens=12)
    plain = client.chat.completions.create(**args).choices[0].message.content
    text = client.chat.completions.create(**args, response_format={"type": "text"})
    assert text.choices[0].message.content == plain


@pytest.mark.parametrize(
    "extra, check",
    [
        ({"structured_outputs": {"choice": ["red", "green"]}}, lambda t: t in ("red", "green")),
        ({"guided_choice": ["up", "down"]}, lambda t: t in ("up", "down")),
        ({"structured_outputs": {"regex": r"\d{3}-[xy]"}}, re.compile(r"\d{3}-[xy]").fullmatch),
        ({"guided_regex": "(ab|cd){2}"}, re.compile("(ab|cd){2}").fullmatch),
        ({"guided_grammar": 'root ::= "<" [0-9] ">"'}, re.compile("<[0-9]>").fullmatch),
        (
            {"structured_outputs": {"json": SCHEMA}},
            lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None,
        ),
        (
            {"guided_json": json.dumps(SCHEMA)},
            lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None,
        ),
    ],
)
def test_vllm_parameters_on_completions_and_chat(client, extra, check):
    completions = client.completions.create(
        model="tiny", prompt="x", n=2, temperature=1.0, seed=5, max_tokens=200, extra_body=extra
    )
    chat = client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=1.0, seed=5, max_completion_tokens=200,
        extra_body=extra,
    )  # fmt: skip
    texts = [c.text for c in completions.choices] + [chat.choices[0].message.content]
    assert all(check(text) for text in texts), texts
    assert {c.finish_reason for c in [*completions.choices, *chat.choices]} == {"stop"}


def test_max_tokens_cut_off_is_length_with_a_valid_prefix(client):
    response = client.completions.create(
        model="tiny", prompt="x", max_tokens=3, extra_body={"guided_regex": "[ab]{40}"}
    )
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert re.fullmatch("[ab]+", choice.text) and len(choice.text) < 40


def test_stop_does_not_end_a_constrained_output_early(client):
    response = client.completions.create(
        model="tiny", prompt="x", max_tokens=20, stop=["a", "b"],
        extra_body={"guided_choice": ["abab"], "min_tokens": 15},
    )  # fmt: skip
    assert (response.choices[0].text, response.choices[0].finish_reason) == ("abab", "stop")


def _error(client, **kwargs) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, **kwargs)
    assert info.value.status_code == 400
    return info.value.body


@pytest.mark.parametrize(
    "kwargs, param, message",
    [
        (
            {"response_format": RESPONSE_FORMAT | {"json_schema": {"name": "x", "schema": {
                "type": "frobnicate"}}}},
            "response_format.json_schema.schema",
            'response_format.json_schema.schema: invalid json schema: Unsupported type '
            '"frobnicate"',
        ),
        (
            {"extra_body": {"guided_regex": "a["}},
            "guided_regex",
            "guided_regex: invalid regex: Regex parsing error at position 3: Unclosed '['",
        ),
        (
            {"extra_body": {"structured_outputs": {"grammar": "root ::= nowhere"}}},
            "structured_outputs.grammar",
            'structured_outputs.grammar: invalid grammar: EBNF parser error at line 1, '
            'column 10: Rule "nowhere" is not defined',
        ),
        (
            {"extra_body": {"guided_json": {"type": "array", "contains": {"type": "null"}}}},
            "guided_json",
            "guided_json: invalid json schema: unsupported keyword 'contains' at /contains",
        ),
        (
            {"extra_body": {"guided_json": "{not json"}},
            "guided_json",
            "guided_json: the JSON schema is not valid JSON",
        ),
        (
            {"extra_body": {"guided_choice": []}},
            "guided_choice",
            "guided_choice: invalid choice: must be a non-empty list of non-empty strings",
        ),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}},
            "guided_regex",
            "only one kind of structured output can be asked for; got 'response_format', "
            "'guided_regex'",
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "'response_format.json_schema' is required with type 'json_schema' and only "
            "allowed with it",
        ),
        (
            {"extra_body": {"structured_outputs": {"whitespace_pattern": " "}}},
            "structured_outputs.whitespace_pattern",
            "unknown parameter 'structured_outputs.whitespace_pattern'",
        ),
    ],
)  # fmt: skip
def test_unusable_constraints_are_400_naming_the_parameter(client, kwargs, param, message):
    assert _error(client, **kwargs) == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }
