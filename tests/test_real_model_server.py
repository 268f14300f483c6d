"""SmolLM2-135M-Instruct served by a real ``kvserve serve``, driven by the OpenAI SDK: sensible
chat answers, a stream that joins to the same answer, ``response_format`` (a Pydantic model
parses; an integer field ends), and ``tool_choice`` ``required`` and named. (``auto`` is not
tried: SmolLM2's chat template does not render tools.)"""

import json

import openai
import pytest
from pydantic import BaseModel

from real_model import REAL_MODEL, SERVED_NAME, requires_real_model
from server_process import API_KEY, ServerProcess

pytestmark = requires_real_model
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


class Country(BaseModel):
    name: str
    capital: str


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    assert REAL_MODEL is not None
    log = tmp_path_factory.mktemp("real-server") / "server.log"
    args = ("--served-model-name", SERVED_NAME, "--max-model-len", "2048", "--num-kv-blocks", "256")
    with ServerProcess(REAL_MODEL, *args, log=log) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


def chat(client, **kwargs):
    args = dict(model=SERVED_NAME, messages=FRANCE, max_tokens=64, temperature=0) | kwargs
    return client.chat.completions.create(**args)


def test_the_model_answers_a_question_and_stops(client):
    assert [m.id for m in client.models.list()] == [SERVED_NAME]
    choice = chat(client).choices[0]
    assert choice.message.content == "The capital of France is Paris."
    assert choice.finish_reason == "stop"


def test_a_stream_joins_to_the_same_answer_with_its_usage(client):
    whole = chat(client, messages=[{"role": "user", "content": "Name a big animal."}])
    chunks = list(
        chat(
            client,
            messages=[{"role": "user", "content": "Name a big animal."}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(text.split()) >= 3
    assert chunks[-1].usage == whole.usage


def test_a_pydantic_response_format_parses(client):
    completion = client.chat.completions.parse(
        model=SERVED_NAME,
        messages=[{"role": "user", "content": "Describe France as JSON: its name and capital."}],
        response_format=Country,
        max_completion_tokens=100,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Country)
    assert choice.message.parsed.capital == "Paris"


def test_an_integer_field_ends(client):
    schema = {
        "type": "object",
        "properties": {"year": {"type": "integer"}},
        "required": ["year"],
        "additionalProperties": False,
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "year", "schema": schema}}
    question = "In which year did Apollo 11 land on the Moon? Answer as JSON."
    choice = chat(
        client,
        messages=[{"role": "user", "content": question}],
        response_format=response_format,
        max_tokens=100,
    ).choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content)["year"], int)


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_tool_choice_required_and_named_call_the_weather_tool(client, tool_choice):
    question = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    message = chat(client, messages=question, tools=TOOLS, tool_choice=tool_choice, max_tokens=100)
    (call,) = message.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] == "Paris"
