"""Qwen3.5 and Qwen3.5-MoE give transformers' greedy tokens in float32, from their image-text
checkpoints (the language model alone) and a text-only one, under the default settings and
under chunked prefill (13-token chunks, which split the delta rule's 64-token chunks) with
preemption, prompts of 1 to 200 tokens, the audit of blocks and state slots after every
step."""

import random

import pytest
from test_engine_matches_transformers import make_prompts
from test_qwen3_next import SCENARIOS, greedy_matches

from kvserve.engine.models.model_config import ModelConfig

from hybrid_checkpoints import build_qwen3_5, build_qwen3_5_image_text

CHECKPOINTS = {
    "qwen3_5-image-text": ("qwen3_5_text", True, "Qwen3_5ForConditionalGeneration"),
    "qwen3_5_moe-image-text": ("qwen3_5_moe_text", True, "Qwen3_5MoeForConditionalGeneration"),
    "qwen3_5-text": ("qwen3_5_text", False, "Qwen3_5ForCausalLM"),
}


@pytest.fixture(scope="module", params=CHECKPOINTS)
def qwen3_5(request, tmp_path_factory):
    family, image_text, architecture = CHECKPOINTS[request.param]
    path = tmp_path_factory.mktemp(request.param) / "model"
    path.mkdir()
    build = build_qwen3_5_image_text if image_text else build_qwen3_5
    build(path, family)
    cfg = ModelConfig.from_dir(path)
    assert (cfg.architecture, cfg.num_layers, cfg.linear_layers) == (architecture, 3, (0, 2))
    assert (cfg.moe is not None) == ("moe" in family)
    return path


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_greedy_matches_transformers(qwen3_5, scenario):
    prompts = make_prompts(seed=54, shared_prefixes=scenario != "default-settings")
    engine = greedy_matches(qwen3_5, SCENARIOS[scenario], prompts)
    assert [(g.kind, g.layers) for g in engine.kv.groups] == [("full_attention", (1,))]
    if scenario != "default-settings":
        assert engine.stats.num_preemptions > 0


def test_prompts_of_1_to_200_tokens_match_transformers_in_chunks_that_split_delta_chunks(
    qwen3_5,
):
    settings = SCENARIOS["chunked-prefill-preemption"] | {"num_kv_blocks": 120}
    rng = random.Random(55)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (1, 2, 9, 64, 77, 200)]
    greedy_matches(qwen3_5, settings, prompts)
