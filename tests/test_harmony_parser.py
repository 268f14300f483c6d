"""gpt-oss's harmony output (``--tool-call-parser openai``, ``--reasoning-parser
openai_gptoss``): the analysis channel is ``reasoning_content`` and never content, the
final channel is the content, commentary to ``functions.NAME`` is a call; whole and
streamed, on exact strings and through a real server whose tokenizer has harmony's
special tokens."""

import json
import random
import urllib.request

import pytest

from kvserve.server.reasoning_parsers import REASONING_PARSERS
from kvserve.server.reasoning_parsers.base import ReasoningStream
from kvserve.server.tool_parsers import TOOL_PARSERS
from kvserve.server.tool_parsers.base import ParsedCall, ToolCallStream
from kvserve.server.tool_parsers.harmony import HarmonyOutput, read_harmony

from checkpoints import build_checkpoint
from harmony_checkpoints import CALL, RETURN, harmony_tokenizer, use_harmony
from server_process import API_KEY, ServerProcess

ANALYSIS = "<|channel|>analysis<|message|>Think about Paris.<|end|>"
WEATHER = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
WEATHER_CALL = ParsedCall("get_weather", '{"city": "Paris"}')


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ANALYSIS + FINAL, HarmonyOutput("Think about Paris.", "It is sunny.")),
        (ANALYSIS + WEATHER, HarmonyOutput("Think about Paris.", "", [WEATHER_CALL])),
        # The recipient before the channel, the content type without <|constrain|>.
        (
            "<|start|>assistant to=functions.get_time<|channel|>commentary json"
            '<|message|>{"zone": "UTC"}<|call|>',
            HarmonyOutput("", "", [ParsedCall("get_time", '{"zone": "UTC"}')]),
        ),
        # A preamble (commentary to no one) is content; a built-in tool's call is neither.
        (
            "<|channel|>commentary<|message|>Checking. <|end|>"
            "<|start|>assistant<|channel|>analysis to=browser.search<|message|>{}<|call|>"
            + WEATHER,
            HarmonyOutput("", "Checking. ", [WEATHER_CALL]),
        ),
        (
            ANALYSIS + "<|start|>assistant<|channel|>analysis<|message|>Sunny.<|end|>" + FINAL,
            HarmonyOutput("Think about Paris.\nSunny.", "It is sunny."),
        ),
        # Cut by max_tokens: in a body, the body so far; in a header, nothing of it.
        (ANALYSIS + FINAL[:-14], HarmonyOutput("Think about Paris.", "It is su")),
        (ANALYSIS + "<|start|>assistant<|channel|>fin", HarmonyOutput("Think about Paris.")),
        ("No markup at all.", HarmonyOutput("", "No markup at all.")),
    ],
)  # fmt: skip
def test_harmony_output(text, expected):
    assert read_harmony(text, final=True) == expected


def pieces(text: str, seed: int) -> list[str]:
    """``text`` cut at random places, special tokens kept whole as the engine sends them."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, len(text) // 4)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return chunks


@pytest.mark.parametrize("text", [ANALYSIS + FINAL, ANALYSIS + WEATHER + WEATHER, FINAL[:-5]])
@pytest.mark.parametrize("seed", range(8))
def test_streamed_deltas_add_up_to_the_whole_parse(text, seed):
    tools = ToolCallStream(TOOL_PARSERS["openai"](), parallel=True)
    reasoning = ReasoningStream(REASONING_PARSERS["openai_gptoss"]())
    chunks = pieces(text, seed)
    got_reasoning, got_content, calls = "", "", []
    for i, chunk in enumerate(chunks):
        final = i == len(chunks) - 1
        got_reasoning += reasoning.delta(chunk, final).reasoning
        delta = tools.delta(chunk, final)
        got_content += delta.get("content", "")
        for piece in delta.get("tool_calls", []):
            if "id" in piece:
                calls.append(ParsedCall(piece["function"]["name"], ""))
            calls[piece["index"]].arguments += piece["function"]["arguments"]
    whole = read_harmony(text, final=True)
    assert (got_reasoning, got_content, calls) == (whole.reasoning, whole.content, whole.calls)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("harmony-model")
    use_harmony(build_checkpoint("llama", path, eos_token_id=[RETURN, CALL]))
    log = tmp_path_factory.mktemp("harmony-server") / "server.log"
    args = (
        "--enable-auto-tool-choice", "--tool-call-parser", "openai",
        "--reasoning-parser", "openai_gptoss", "--num-kv-blocks", "64",
    )  # fmt: skip
    with ServerProcess(path, *args, log=log) as s:
        yield s


def crafted(output: str, **extra) -> dict:
    """A chat request whose output structured outputs hold to exactly ``output``."""
    return {
        "model": "tiny", "messages": MESSAGES, "max_tokens": 300, "temperature": 0,
        "structured_outputs": {"choice": [output]}, **extra,
    }  # fmt: skip


def prompt_tokens() -> int:
    tokenizer = harmony_tokenizer()
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return len(tokenizer.encode(prompt, add_special_tokens=False))


def test_reasoning_and_final_channel_body(server):
    body = server.post("/v1/chat/completions", crafted(ANALYSIS + FINAL))
    completion_tokens = body["usage"]["completion_tokens"]
    assert body == {
        "id": body["id"],
        "object": "chat.completion",
        "created": body["created"],
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "It is sunny.",
                    "reasoning_content": "Think about Paris.",
                },
                "logprobs": None,
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens(),
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens() + completion_tokens,
        },
    }


def test_a_call_on_the_commentary_channel_is_a_tool_call(server):
    body = server.post("/v1/chat/completions", crafted(ANALYSIS + WEATHER, tools=TOOLS))
    (choice,) = body["choices"]
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-")
    assert choice == {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
            "reasoning_content": "Think about Paris.",
        },
        "logprobs": None,
        "finish_reason": "tool_calls",
        "stop_reason": None,
    }


def stream(server, request: dict) -> list[dict]:
    """The chunks of a streamed chat completion, up to ``[DONE]``."""
    http = urllib.request.Request(
        server.url + "/v1/chat/completions",
        data=json.dumps(request | {"stream": True}).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(http, timeout=60) as response:
        events = response.read().decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    return [json.loads(event.removeprefix("data: ")) for event in events[:-2]]


def test_streamed_reasoning_never_reaches_the_content(server):
    deltas = [c["choices"][0]["delta"] for c in stream(server, crafted(ANALYSIS + FINAL))]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Think about Paris."
    assert "".join(d.get("content", "") for d in deltas) == "It is sunny."
    assert all(set(d) <= {"role", "content", "reasoning_content"} for d in deltas)


def test_streamed_call_chunks(server):
    chunks = stream(server, crafted(ANALYSIS + WEATHER, tools=TOOLS))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Think about Paris."
    assert not any(d.get("content") for d in deltas)
    pieces = [p for d in deltas for p in d.get("tool_calls", [])]
    assert pieces[0]["id"].startswith("chatcmpl-tool-")
    assert pieces[0] | {"id": "x"} == {
        "index": 0, "id": "x", "type": "function",
        "function": {"name": "get_weather", "arguments": pieces[0]["function"]["arguments"]},
    }  # fmt: skip
    assert "".join(p["function"]["arguments"] for p in pieces) == '{"city": "Paris"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
