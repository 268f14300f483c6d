"""The OpenAI API of a real ``kvserve serve`` process, driven by the official SDK."""

import asyncio

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvserve import LLM, SamplingParams

from rank_counts import TENSOR_PARALLEL, TENSOR_PARALLEL_IDS
from server_process import API_KEY, ServerProcess

pytestmark = pytest.mark.usefixtures("scheduling", "speculation")

PROMPT = "def split(text, sep):\n    return"


@pytest.fixture(scope="module")
def model_dir(checkpoint):
    return checkpoint("llama")


@pytest.fixture(scope="module", params=TENSOR_PARALLEL, ids=TENSOR_PARALLEL_IDS)
def server(model_dir, tmp_path_factory, request, scheduling, speculation):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ("--num-kv-blocks", "256", "--max-num-seqs", "16", "--tensor-parallel-size")
    with ServerProcess(model_dir, *args, str(request.param), log=log) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def offline(model_dir, scheduling, speculation):
    return LLM(str(model_dir), num_kv_blocks=256)


@pytest.fixture(scope="module")
def reference(model_dir):
    """Log-softmax of the transformers model's logits for a token sequence."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def logprobs(token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([token_ids])).logits[0], dim=-1)

    return logprobs


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def greedy(offline, prompt, max_tokens=8, **kw):
    return offline.generate([prompt], SamplingParams(temperature=0, max_tokens=max_tokens, **kw))[
        0
    ].outputs[0]


def test_completion_equals_the_offline_engine(client, offline, tokenizer):
    expected = greedy(offline, PROMPT)
    result = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    choice = result.choices[0]
    assert choice.text == expected.text
    assert choice.finish_reason == "length"
    assert result.model == "tiny"
    assert result.object == "text_completion"
    assert result.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert result.usage.completion_tokens == 8
    assert result.usage.total_tokens == result.usage.prompt_tokens + 8


def test_stream_deltas_add_up_to_the_text_and_usage_comes_last(client, offline):
    expected = greedy(offline, PROMPT, max_tokens=12)
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks[:-1]) == expected.text
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 12


def test_chat_uses_the_checkpoint_template(client, offline, tokenizer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    expected = greedy(offline, prompt_ids, max_tokens=6)
    result = client.chat.completions.create(
        model="tiny", messages=messages, max_completion_tokens=6, temperature=0
    )
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == expected.text
    assert result.usage.prompt_tokens == len(prompt_ids)
    assert result.usage.completion_tokens == 6
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_samples_use_seed_plus_index(client):
    def sample(n, seed):
        result = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, n=n, seed=seed
        )
        return [c.text for c in sorted(result.choices, key=lambda c: c.index)]

    three = sample(3, 7)
    assert three == sample(3, 7)
    assert three == [sample(1, 7)[0], sample(1, 8)[0], sample(1, 9)[0]]
    assert len(set(three)) == 3


def test_n_samples_share_the_prompt_blocks(server, client):
    prompt = list(range(10, 74))  # 64 tokens: the first three 16-token blocks can be shared
    hits = server.metric("vllm:prefix_cache_hits_total")
    result = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, n=4)
    assert len(result.choices) == 4
    assert server.metric("vllm:prefix_cache_hits_total") - hits == 3 * 48


def test_a_seed_fixes_the_output_whatever_else_is_batched(server):
    async def run() -> tuple[str, list[str]]:
        kwargs = dict(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0.9)
        url = server.url + "/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0) as client:
            alone = (await client.completions.create(**kwargs, seed=11)).choices[0].text
            crowd = await asyncio.gather(
                *[client.completions.create(**kwargs, seed=11) for _ in range(3)],
                *[client.completions.create(**kwargs | {"prompt": "x" * i}) for i in range(1, 6)],
            )
        return alone, [r.choices[0].text for r in crowd[:3]]

    alone, batched = asyncio.run(run())
    assert batched == [alone] * 3


def test_stop_string_spanning_tokens_ends_the_text_before_it(client, offline, tokenizer):
    full = greedy(offline, PROMPT, max_tokens=16)
    pieces = [tokenizer.decode([t]) for t in full.token_ids]
    cut = len(pieces[0]) + len(pieces[1]) + len(pieces[2]) - 1  # inside the third token
    stop = full.text[cut - 2 : cut + 2]  # spans the third and fourth tokens
    index = full.text.index(stop)
    result = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "@@@@"]
    )
    choice = result.choices[0]
    assert choice.text == full.text[:index]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop
    streamed = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == full.text[:index]


def test_logprobs_are_the_log_softmax_of_the_model(client, offline, tokenizer, reference):
    result = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3
    )
    logprobs = result.choices[0].logprobs
    prompt_ids = tokenizer.encode(PROMPT)
    output_ids = greedy(offline, PROMPT, max_tokens=5).token_ids
    expected = reference(prompt_ids + output_ids)[len(prompt_ids) - 1 : -1]
    chosen = expected.gather(1, torch.tensor(output_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(logprobs.token_logprobs), chosen, atol=1e-4)
    assert all(len(top) == 3 for top in logprobs.top_logprobs)
    best = expected.max(dim=-1).values
    assert torch.allclose(torch.tensor([max(t.values()) for t in logprobs.top_logprobs]), best)
    assert logprobs.text_offset[0] == 0


def test_chat_logprobs_and_top_logprobs(client, offline, reference, tokenizer):
    messages = [{"role": "user", "content": "hello"}]
    result = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = result.choices[0].logprobs.content
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    output_ids = greedy(offline, prompt_ids, max_tokens=4).token_ids
    expected = reference(prompt_ids + output_ids)[len(prompt_ids) - 1 : -1]
    for row, item in enumerate(content):
        assert item.logprob == pytest.approx(expected[row].max().item(), abs=1e-4)
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob == pytest.approx(item.logprob, abs=1e-6)
        assert item.bytes == list(item.token.encode())


def test_echo_returns_the_prompt_with_its_logprobs(client, tokenizer, reference):
    prompt_ids = tokenizer.encode(PROMPT)
    result = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=2, temperature=0, echo=True, logprobs=0
    )
    choice = result.choices[0]
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 2
    assert lp.token_logprobs[0] is None
    expected = reference(prompt_ids)[:-1].gather(1, torch.tensor(prompt_ids[1:])[:, None])[:, 0]
    got = torch.tensor(lp.token_logprobs[1 : len(prompt_ids)])
    assert torch.allclose(got, expected, atol=1e-4)


def test_logit_bias_and_min_tokens(client, tokenizer):
    token = tokenizer.encode(" the")[0]
    result = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={str(token): 100}
    )
    assert result.choices[0].text == tokenizer.decode([token] * 4)
    eos = tokenizer.eos_token_id
    result = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logit_bias={str(eos): 100},
        extra_body={"min_tokens": 3},
    )
    assert result.usage.completion_tokens == 4  # three forced non-EOS tokens, then EOS
    assert result.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        (dict(best_of=2), "best_of"),
        (dict(suffix="x"), "suffix"),
        (dict(temperature=3.0), "temperature"),
        (dict(extra_body={"frobnicate": 1}), "frobnicate"),
        (dict(max_tokens=10_000), "max_tokens"),
        (dict(prompt="x " * 600), "prompt"),
        (dict(logprobs=21), "logprobs"),
        (dict(logit_bias={"512": 1}), "logit_bias"),
        (dict(extra_body={"stop_token_ids": [600]}), "stop_token_ids"),
        (dict(extra_body={"min_tokens": 9}), "min_tokens"),
        (dict(prompt=[5, 9999]), "prompt"),
    ],
)
def test_bad_parameters_are_400_naming_the_parameter(client, kwargs, param):
    args = dict(model="tiny", prompt=PROMPT, max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**args)
    assert info.value.status_code == 400
    assert info.value.body["param"] == param
    assert info.value.body["type"] == "invalid_request_error"


def test_tools_without_a_tool_call_parser_are_400_as_in_vllm(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    assert info.value.body == {
        "message": '"auto" tool choice requires --enable-auto-tool-choice and '
        "--tool-call-parser to be set",
        "type": "invalid_request_error",
        "param": "tool_choice",
        "code": None,
    }


def test_wrong_key_is_401_and_unknown_model_is_404(server, client):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.completions.create(model="tiny", prompt="x")
    assert info.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    for path in ("/health", "/ready", "/metrics", "/version"):
        assert server.status(path) == 200  # open without a key
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-5", prompt="x")
    assert info.value.body["message"] == "The model `gpt-5` does not exist."


def test_request_id_header_is_honoured_and_echoed(client):
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt="x", max_tokens=1, extra_headers={"X-Request-Id": "req-42"}
    )
    assert raw.headers["x-request-id"] == "req-42"
    assert raw.parse().id == "cmpl-req-42"


def test_models_tokenize_detokenize_version(server, client, tokenizer):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].model_extra["max_model_len"] == 512
    ids = server.post("/tokenize", {"prompt": PROMPT, "model": "tiny"})
    expected = tokenizer.encode(PROMPT)
    assert ids == {"tokens": expected, "count": len(expected), "max_model_len": 512}
    text = server.post("/detokenize", {"tokens": ids["tokens"]})
    assert text == {"prompt": PROMPT}
    assert server.get("/version") == '{"version": "0.1.0"}'


def test_continuous_usage_stats_count_tokens_in_every_chunk(client):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options=options,
            extra_body={"ignore_eos": True},
        )
    )
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts)
    assert counts[-1] == 4
    assert chunks[-1].choices == []
