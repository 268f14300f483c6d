"""Speculative decoding with a draft model: outputs identical to the target's alone (greedy
and seeded), under block pressure with chunked prefill, prefix caching and preemption, with
every block accounted for after each step; a draft identical to the target is always right."""

import pytest

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm import LLM
from kvserve.engine.llm_engine import LLMEngine

from audit import run_audited
from checkpoints import build_checkpoint

PROMPTS = [
    [11, 12, 13, 14, 15] * 4,
    [300, 301, 302],
    [7, 8, 9, 10, 7, 8, 9, 10, 7],
    list(range(40, 70)),
    [11, 12, 13, 14, 15] * 4 + [99],  # shares the first's blocks
]
PRESSURE = {"num_kv_blocks": 24, "max_num_batched_tokens": 16, "block_size": 4, "max_num_seqs": 4}


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory):
    """Another random model of the target's family and tokenizer: one layer, other weights."""
    return build_checkpoint("llama", tmp_path_factory.mktemp("draft"), seed=1, num_hidden_layers=1)


def run(path, params, speculative_config=None):
    """Every prompt's output, stepping one engine under block pressure, audited each step."""
    engine = LLMEngine(
        EngineConfig(model=path, dtype="float32", speculative_config=speculative_config, **PRESSURE)
    )
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params.replace(seed=i) if params.seed else params)
    finished = run_audited(engine)
    return [finished[str(i)] for i in range(len(PROMPTS))], engine


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
        SamplingParams(max_tokens=24, temperature=0.05, seed=1, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_a_draft_identical_to_the_target_is_always_accepted(checkpoint, params):
    path = str(checkpoint("llama"))
    expected, plain = run(path, params)
    config = {"method": "draft_model", "model": path, "num_speculative_tokens": 3}
    got, engine = run(path, params, config)
    assert got == expected
    assert plain.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0
    stats = engine.speculator.stats
    assert stats.num_draft_tokens > 50
    if params.temperature == 0:
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    else:
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_a_smaller_draft_of_the_family_leaves_greedy_outputs_unchanged(checkpoint, small_draft):
    path = str(checkpoint("llama"))
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    expected, _ = run(path, params)
    config = {"method": "draft_model", "model": str(small_draft), "num_speculative_tokens": 3}
    got, engine = run(path, params, config)
    assert got == expected
    stats = engine.speculator.stats
    assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_draft_model_errors_name_the_field(checkpoint, tmp_path):
    path = str(checkpoint("llama"))
    with pytest.raises(ValueError, match=r"speculative_config\.model is required"):
        EngineConfig(
            model=path, speculative_config={"method": "draft_model", "num_speculative_tokens": 2}
        )
    draft = {"method": "draft_model", "model": path, "num_speculative_tokens": 2}
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        with pytest.raises(ValueError, match=f"runs with {name} 1, not 2"):
            EngineConfig(model=path, speculative_config=draft, **{name: 2})
    other = build_checkpoint("llama", tmp_path / "other", vocab_size=8)
    with pytest.raises(ValueError, match="has a vocabulary of 8 tokens"):
        LLM(
            path,
            num_kv_blocks=16,
            speculative_config={
                "method": "draft_model",
                "model": str(other),
                "num_speculative_tokens": 2,
            },
        )
