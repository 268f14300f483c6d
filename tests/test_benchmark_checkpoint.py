"""benchmarks/checkpoint.py: the bytes a decode step reads, with a tied and an untied head,
on tiny models of the two families its shapes use (the real shapes take a minute to build)."""

import importlib
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, Qwen2Config

ROOT = Path(__file__).resolve().parent.parent
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "vocab_size": 64}


@pytest.fixture
def checkpoint(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module("checkpoint")
    yield module
    sys.modules.pop("checkpoint", None)


def tiny_qwen2(dtype: torch.dtype) -> Qwen2Config:
    return Qwen2Config(
        **TINY, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, dtype=dtype
    )


def tiny_llama(dtype: torch.dtype) -> LlamaConfig:
    return LlamaConfig(
        **TINY, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False, dtype=dtype
    )


# Per layer: q 32x32 + 32 bias, k and v 16x32 + 16 bias each (2 kv heads of 8), o 32x32,
# gate, up and down 64x32 each: 9,216 linear weights, 9,344 with biases and two norms of 32.
# Llama: no q/k/v biases, k and v 32x32 (4 kv heads): 10,240 linear weights, 10,304 in all.
@pytest.mark.parametrize(
    "shape, config, params, read, linears",
    [
        # tied: embedding 2,048 + 2 layers + final norm 32; the head is the embedding, read
        ("tiny-tied", tiny_qwen2, 2048 + 2 * 9344 + 32, (2048 + 2 * 9344 + 32) * 2, 2 * 9216),
        # untied: + a 2,048-weight head; the input embedding is not read by a decode step
        ("tiny-untied", tiny_llama, 2 * 2048 + 2 * 10304 + 32, (2048 + 2 * 10304 + 32) * 2,
         2 * 10240),
    ],
)  # fmt: skip
def test_a_decode_step_reads_every_weight_but_the_input_embedding(
    tmp_path, monkeypatch, checkpoint, shape, config, params, read, linears
):
    monkeypatch.setitem(checkpoint.SHAPES, shape, config)
    built = checkpoint.build_checkpoint(tmp_path / "m", torch.bfloat16, shape=shape)
    assert (built.num_params, built.decode_weight_bytes) == (params, read)
    assert (built.layer_linear_params, built.lm_head_params) == (linears, 2048)
    saved = AutoConfig.from_pretrained(tmp_path / "m")
    assert saved.model_type == config(torch.bfloat16).model_type
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert len(tokenizer) == 64
    assert tokenizer.convert_ids_to_tokens([63, 2]) == ["w63", "w2"]  # every id decodes
