"""Tiny GGUF files written on the spot with the ``gguf`` package, as llama.cpp's converter
writes them: random weights from a transformers model (q/k rows permuted for llama), quantized
to the asked types, and the tests' trained tokenizer as ``tokenizer.ggml.*`` metadata."""

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import AutoModelForCausalLM

from checkpoints import CHAT_TEMPLATE, CONFIGS, trained_tokenizer

BASE = dict(
    vocab_size=512,
    hidden_size=256,  # K-quant blocks are 256 input features
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=0,
    pad_token_id=0,
)
_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
Q = gguf.GGMLQuantizationType
# Where a K-quant block keeps its float16 super-block scales (d, and dmin where it has one).
_K_SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def gguf_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        layer, rest = hf.removeprefix("model.layers.").split(".", 1)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{_NAMES[module]}.{kind}"
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    module, kind = hf.rsplit(".", 1)
    return f"{top[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: each head's two rotary halves interleaved."""
    rows = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
    return rows.swapaxes(1, 2).reshape(w.shape)


def encode(w: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """``w`` in ``qtype``: quantized by the package where it can; K-quants (which it only
    decodes) as random blocks whose scales give values of ``w``'s spread."""
    if qtype == Q.F32:
        return w.astype(np.float32)
    if qtype == Q.F16:
        return w.astype(np.float16)
    if qtype not in _K_SCALES:
        return gguf.quants.quantize(w.astype(np.float32), qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (w.shape[0], w.shape[1] // block, size), dtype=np.uint8)

    def decoded(*scales: float) -> np.ndarray:
        for offset, scale in zip(_K_SCALES[qtype], scales, strict=False):
            raw[..., offset : offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
        return gguf.quants.dequantize(raw.reshape(w.shape[0], -1), qtype)

    # values = d * a - dmin * b: a dmin that centres them, then both scaled to w's spread
    ratio = decoded(1, 0).mean() / -decoded(0, 1).mean() if len(_K_SCALES[qtype]) == 2 else 0
    gain = w.std() / decoded(1, ratio).std()
    decoded(gain, gain * ratio)
    return raw.reshape(w.shape[0], -1)


def write_gguf(
    path: Path, family: str = "llama", types: tuple[str, ...] = ("F32",), seed: int = 0, **overrides
) -> Path:
    """A random-weight ``family`` model as the GGUF file ``path``, its 2-D tensors in
    ``types`` by turns (1-D ones in F32, as llama.cpp keeps norms); ``overrides`` change
    config fields. Writes config.json's fields beside it as ``path.with_suffix('.json')`` for
    the tests to compare against."""
    config = CONFIGS[family](**{**BASE, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, family)
    writer.add_name(f"tiny-{family}")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer)
    two_d = 0
    for name, param in model.state_dict().items():
        w = param.numpy()
        if w.ndim == 2 or name.endswith(".bias"):
            w = rng.normal(0, 0.08, w.shape).astype(np.float32)
        if family == "llama" and ".q_proj." in name:
            w = permute(w, config.num_attention_heads)
        elif family == "llama" and ".k_proj." in name:
            w = permute(w, config.num_key_value_heads)
        qtype = Q.F32
        if w.ndim == 2:
            qtype = Q[types[two_d % len(types)]]
            two_d += 1
        data = encode(w, qtype, rng)
        raw = qtype if qtype not in (Q.F32, Q.F16) else None
        writer.add_tensor(gguf_name(name), data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    written = {**config.to_dict(), "architectures": [type(model).__name__]}
    path.with_suffix(".json").write_text(json.dumps(written))
    return path


def _add_tokenizer(writer: gguf.GGUFWriter) -> None:
    tokenizer = trained_tokenizer()
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {t["content"] for t in state["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    merges = state["model"]["merges"]
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
