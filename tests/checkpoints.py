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
    Gemma3TextConfig,
    Gemma4TextConfig,
    GptOssConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# CHAT_TEMPLATE, plus tools as Hermes-style models (Qwen2.5, Qwen3) see them: the tools in
# the system turn, calls in <tool_call> blocks, results in <tool_response> blocks. Written
# with trim_blocks in mind (transformers renders with it): no newline right after a tag.
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "You may call these functions:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "</tools>\nCall one as <tool_call>\n"
    '{"name": <function name>, "arguments": <arguments object>}\n</tool_call><|im_end|>\n'
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and tools and loop.first %}"
    "{% elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{% if m.content %}{{ m.content }}\n{% endif %}"
    "{% for call in m.tool_calls %}<tool_call>\n"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "\n</tool_call>\n{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_SIZE = 512

CONFIGS = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "qwen2_moe": Qwen2MoeConfig,
    "qwen3_moe": Qwen3MoeConfig,
    "mixtral": MixtralConfig,
    "gpt_oss": GptOssConfig,
    "gemma3_text": Gemma3TextConfig,
    "gemma4_text": Gemma4TextConfig,
    "qwen3_next": Qwen3NextConfig,
    "qwen3_5_text": Qwen3_5TextConfig,
    "qwen3_5_moe_text": Qwen3_5MoeTextConfig,
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
def trained_tokenizer(
    special_tokens: tuple[str, ...] = tuple(SPECIAL_TOKENS),
    eos_token: str = "<|endoftext|>",
    chat_template: str = CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """A 512-token byte-level BPE trained on a few standard-library sources, its
    ``special_tokens`` first (ids 0, 1, ...)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(stdlib / name) for name in ("textwrap.py", "string/__init__.py", "shlex.py")]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train([f for f in files if Path(f).exists()], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos_token,
        pad_token=eos_token,
        chat_template=chat_template,
    )


def build_checkpoint(
    family: str, path: Path, seed: int = 0, chat_template: str = CHAT_TEMPLATE, **overrides
) -> Path:
    """Write a random-weight ``family`` checkpoint (fp32, safetensors) and the
    shared tokenizer with ``chat_template`` to ``path``; ``overrides`` change config fields."""
    config = CONFIGS[family](**{**BASE, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: sharper, less tie-prone logits
        for name, param in model.named_parameters():
            if param.dim() >= 2 or name.endswith(".bias"):  # biases nonzero: a path dropping
                param.normal_(0, 0.08)  # one must change the tokens
    model.save_pretrained(path)
    trained_tokenizer().save_pretrained(path)
    (path / "chat_template.jinja").write_text(chat_template)
    return path


# Each family with the switches that make it differ: GQA ratios, qkv bias (Qwen2),
# q/k norm (Qwen3), llama3 RoPE scaling and tied embeddings (llama3 variant), and a group of
# six query heads on one kv head (as Qwen2.5's 1.5B model groups them), which bf16 decode
# attention takes as dot products where the CPU has AVX-512-BF16.
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
    "qwen2-grouped": ("qwen2", dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=1)),
    "qwen3": ("qwen3", dict(head_dim=32)),
}

# The mixture-of-experts families, 8 experts, 2 per token: Qwen3-MoE with a dense layer
# (mlp_only_layers) and without renormalised top-k weights; again with them, every other layer
# sparse (decoder_sparse_step); Qwen2-MoE with its gated shared expert; Mixtral.
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
MOE_FAMILIES = {
    "qwen3_moe": ("qwen3_moe", dict(MOE, head_dim=32, num_hidden_layers=3, mlp_only_layers=[1])),
    "qwen3_moe-norm-topk": (
        "qwen3_moe",
        dict(MOE, num_hidden_layers=4, norm_topk_prob=True, decoder_sparse_step=2),
    ),
    "qwen2_moe": ("qwen2_moe", dict(MOE, shared_expert_intermediate_size=48)),
    "mixtral": (
        "mixtral",
        dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    ),
}
