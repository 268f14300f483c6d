"""Tiny Hugging Face checkpoints built on the spot: random weights from a
transformers config and a byte-level BPE tokenizer trained on local text, saved
exactly as a real model directory."""

import functools
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_SIZE = 512

CONFIGS = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
}
BASE = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=0,
    pad_token_id=0,
)


@functools.cache
def trained_tokenizer() -> PreTrainedTokenizerFast:
    """A 512-token byte-level BPE trained on a few standard-library sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(stdlib / name) for name in ("textwrap.py", "string/__init__.py", "shlex.py")]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train([f for f in files if Path(f).exists()], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def build_checkpoint(family: str, path: Path, seed: int = 0, **overrides) -> Path:
    """Write a random-weight ``family`` checkpoint (fp32, safetensors) and the
    shared tokenizer to ``path``; ``overrides`` change config fields."""
    config = CONFIGS[family](**{**BASE, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: sharper, less tie-prone logits
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.08)
    model.save_pretrained(path)
    trained_tokenizer().save_pretrained(path)
    return path


# Each family with the switches that make it differ: GQA ratios, qkv bias (Qwen2),
# q/k norm (Qwen3), llama3 RoPE scaling and tied embeddings (llama3 variant).
FAMILIES = {
    "llama": ("llama", {}),
    "llama3-tied": (
        "llama",
        dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "mistral": ("mistral", dict(num_key_value_heads=4, sliding_window=None)),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", dict(head_dim=32)),
}
