"""``kvserve serve --speculative-config``: streamed completions identical to the engine's,
accepted drafts several tokens to a chunk; vLLM's ``spec_decode`` counters on /metrics, with
exactly the counts of an engine that ran the same requests one at a time; a bad config
stops the CLI with a message naming the key."""

import json

import pytest

from kvserve import SamplingParams
from kvserve.engine.llm import LLM
from kvserve.server.cli import build_parser, engine_config

from server_process import ServerProcess

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
PROMPTS = ["def f(x): return x + 1\ndef f(x):", "a b c a b c a b", "hello"]


def test_spec_decode_counters_on_metrics(checkpoint, tmp_path):
    path = checkpoint("llama")
    flags = ("--num-kv-blocks", "64", "--dtype", "float32", "--max-num-seqs", "1")
    llm = LLM(str(path), num_kv_blocks=64, dtype="float32", speculative_config=NGRAM)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    expected = [llm.generate(prompt, params)[0].outputs[0].text for prompt in PROMPTS]
    stats = llm.engine.speculator.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    spec = ("--speculative-config", json.dumps(NGRAM))
    with ServerProcess(path, *flags, *spec, log=tmp_path / "server.log") as server:
        chunks = 0
        for prompt, text in zip(PROMPTS, expected, strict=True):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0}
            body |= {"ignore_eos": True, "stream": True}
            status, _, raw = server.send(
                "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            assert status == 200
            events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            pieces = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
            assert "".join(pieces) == text
            chunks += len(pieces)
        assert chunks < 3 * 24  # accepted drafts come out several tokens to a chunk
        assert server.metric("vllm:spec_decode_num_drafts_total") == stats.num_drafts
        assert server.metric("vllm:spec_decode_num_draft_tokens_total") == stats.num_draft_tokens
        accepted = server.metric("vllm:spec_decode_num_accepted_tokens_total")
        assert accepted == stats.num_accepted_tokens
        per_pos = [
            server.metric("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
            for i in range(3)
        ]
        assert per_pos == stats.num_accepted_tokens_per_pos


def test_a_server_without_speculation_has_no_spec_decode_metric(checkpoint, tmp_path):
    with ServerProcess(checkpoint("llama"), log=tmp_path / "server.log") as server:
        assert "spec_decode" not in server.get("/metrics")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method 'eagle' is not supported"),
        ('{"method": "ngram"}', "speculative_config.num_speculative_tokens is required"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be >= 1"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "k": 1}', "unsupported keys: k"),
        ("ngram", "speculative_config is not JSON"),
    ],
)
def test_a_bad_speculative_config_names_the_key(config, message, capsys):
    with pytest.raises(SystemExit):
        engine_config(build_parser().parse_args(["serve", "--speculative-config", config]))
    assert message in capsys.readouterr().err
