"""The benchmark model: a random-weight, Llama-shaped checkpoint built on the fly.

Hidden 768, 12 layers, 12 heads, MLP 2048, vocabulary 32000, untied head: 134M parameters,
the model of shared/ML-NOTES.md. The tokenizer is a word-level one over 32000 synthetic
words, so that any token id decodes; prompts are token ids, never text.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 32000
EOS_TOKEN = "<|endoftext|>"
MAX_POSITIONS = 2048


def llama_config(dtype: torch.dtype) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=0,
        pad_token_id=0,
        dtype=dtype,
    )


def save_tokenizer(directory: Path) -> None:
    vocab = {EOS_TOKEN: 0, "<s>": 1} | {f"w{i}": i for i in range(2, VOCAB_SIZE)}
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


def build_checkpoint(directory: Path, dtype: torch.dtype, seed: int = 0) -> Checkpoint:
    """Write the random model in `dtype` and its tokenizer to `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(dtype)).to(dtype)
    model.save_pretrained(directory)
    save_tokenizer(directory)
    num_params = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    read = (num_params - embedding.numel()) * embedding.element_size()
    linears = sum(
        m.weight.numel() for m in model.model.layers.modules() if isinstance(m, nn.Linear)
    )
    return Checkpoint(directory, num_params, read, linears, model.lm_head.weight.numel())
