"""The benchmark models: random-weight checkpoints built on the fly, of two shapes.

- ``llama-134m`` (the default, W1's model): Llama, hidden 768, 12 layers, 12 heads (no
  grouping), MLP 2048, vocabulary 32000, untied head: 134M parameters, the model of
  shared/ML-NOTES.md.
- ``qwen2-0.5b``: Qwen2.5-0.5B's shape: hidden 896, 24 layers, 14 query heads sharing 2 KV
  heads, MLP 4864, q/k/v biases, vocabulary 151936 tied to the input embedding: 494M
  parameters, a model people serve on CPUs, whose LM head is a quarter of its weights.
- ``qwen3-moe-1b``: Qwen3-30B-A3B's layout scaled down: hidden 768, 24 layers, 12 query
  heads of 64 sharing 4 KV heads, 64 experts of 256 intermediate features, 8 per token,
  renormalised, vocabulary 32000, untied head: 1.0B parameters, 0.18B of them multiplied
  per token (0.15B in the layers).
- ``qwen3-dense-0.18b``: the dense Qwen3 of that active size: the same, with one MLP of
  2048 (8 x 256) in place of the experts.

The tokenizer is a word-level one over the vocabulary's synthetic words, so that any token
id decodes; prompts are token ids below 32000 (`PROMPT_IDS`), never text.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

VOCAB_SIZE = 32000
"""The default shape's vocabulary; prompts of every shape use ids in `PROMPT_IDS`."""
PROMPT_IDS = (2, VOCAB_SIZE - 1)
"""The inclusive range prompts draw ids from: 0 and 1 are every shape's EOS and BOS."""
EOS_TOKEN = "<|endoftext|>"
MAX_POSITIONS = 2048
SHARED_CONFIG = {
    "max_position_embeddings": MAX_POSITIONS,
    "bos_token_id": 1,
    "eos_token_id": 0,
    "pad_token_id": 0,
}
"""What every shape's config shares: the context length and the special ids of `PROMPT_IDS`."""


def llama_config(dtype: torch.dtype) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        tie_word_embeddings=False,
        dtype=dtype,
        **SHARED_CONFIG,
    )


def qwen2_config(dtype: torch.dtype) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        dtype=dtype,
        **SHARED_CONFIG,
    )


QWEN3_SMALL = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=768,
    num_hidden_layers=24,
    num_attention_heads=12,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=False,
    **SHARED_CONFIG,
)


def qwen3_moe_config(dtype: torch.dtype) -> Qwen3MoeConfig:
    return Qwen3MoeConfig(
        intermediate_size=2048,  # no dense layer uses it
        moe_intermediate_size=256,
        num_experts=64,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        dtype=dtype,
        **QWEN3_SMALL,
    )


def qwen3_dense_config(dtype: torch.dtype) -> Qwen3Config:
    return Qwen3Config(intermediate_size=8 * 256, dtype=dtype, **QWEN3_SMALL)


SHAPES: dict[str, Callable[[torch.dtype], PretrainedConfig]] = {
    "llama-134m": llama_config,
    "qwen2-0.5b": qwen2_config,
    "qwen3-moe-1b": qwen3_moe_config,
    "qwen3-dense-0.18b": qwen3_dense_config,
}


def save_tokenizer(directory: Path, vocab_size: int) -> None:
    vocab = {EOS_TOKEN: 0, "<s>": 1} | {f"w{i}": i for i in range(2, vocab_size)}
    backend = Tokenizer(WordLevel(vocab, unk_token=EOS_TOKEN))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, bos_token="<s>", pad_token=EOS_TOKEN
    )
    tokenizer.save_pretrained(directory)


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    num_params: int
    decode_weight_bytes: int
    """Bytes one decode step must read: every weight but the input embedding table."""
    layer_linear_params: int
    """Weights of the decoder layers' linear layers: each token multiplies by every one."""
    lm_head_params: int
    """Weights of the output projection: only a sequence's last position multiplies by it."""


def build_checkpoint(
    directory: Path, dtype: torch.dtype, seed: int = 0, shape: str = "llama-134m"
) -> Checkpoint:
    """Write the random model of `shape` in `dtype` and its tokenizer to `directory`
    (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = SHAPES[shape](dtype)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.save_pretrained(directory)
    save_tokenizer(directory, config.vocab_size)
    num_params = sum(p.numel() for p in model.parameters())  # a tied head counted once
    embedding = model.get_input_embeddings().weight
    untied = model.lm_head.weight is not embedding
    read = (num_params - embedding.numel() * untied) * embedding.element_size()
    linears = sum(
        m.weight.numel() for m in model.model.layers.modules() if isinstance(m, nn.Linear)
    )
    return Checkpoint(directory, num_params, read, linears, model.lm_head.weight.numel())
