"""GGUF checkpoints (llama.cpp's one-file format), read with llama.cpp's own ``gguf`` package.

The metadata becomes a config.json-shaped dict (``gguf_config``) for ``ModelConfig.from_dict``;
the tensors come out under their Hugging Face names, dequantized to float32 (``GGUFTensors``,
opened as the loader opens a safetensors file), for the same weight loaders. llama.cpp stores
a llama model's q/k projections with the rows of each head interleaved for its RoPE layout
(``convert_hf_to_gguf.py``'s ``permute``); ``GGUFTensors`` undoes that, so that the weights are
exactly the Hugging Face ones."""

import functools
import re
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

ARCHITECTURES = {
    # general.architecture: config.json's architectures[0]
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_PERMUTED_QK = {"llama"}
"""Architectures whose q/k rows llama.cpp's converter interleaves."""
TYPES = tuple(
    GGMLQuantizationType[name]
    for name in (
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    )
)  # fmt: skip
"""The tensor types dequantized at load (``gguf.quants.dequantize``)."""
_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_GLOBAL = re.compile(r"^(\w+)\.(weight|bias)$")


def gguf_file(path: Path) -> Path | None:
    """The GGUF file ``path`` names: ``path`` itself, or the one ``*.gguf`` of a directory
    without config.json; None for anything else (a Hugging Face directory). A ValueError when
    a directory holds several."""
    if path.suffix == ".gguf" and not path.is_dir():
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file {path}")
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ValueError(f"model directory {path} holds several GGUF files ({names}); name one")
    return files[0] if files else None


def _reader(path: Path) -> GGUFReader:
    """The parsed GGUF at ``path``, kept for the next caller while the file is unchanged: the
    config and the tensors read the same file one after the other, and parsing a large
    vocabulary takes seconds."""
    stat = path.stat()
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _parsed(path: Path, mtime_ns: int, size: int) -> GGUFReader:
    return GGUFReader(path)


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


def _architecture(reader: GGUFReader, path: Path) -> str:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r} in {path}; "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    return str(arch)


def gguf_config(path: Path) -> dict[str, Any]:
    """The metadata of the GGUF at ``path`` as config.json's keys. The dtype is the file's
    16-bit one where its weights are F16 or BF16 (None, float32, for quantized ones); the eos
    ids are the tokenizer's end-of-sequence and end-of-turn tokens."""
    reader = _reader(path)
    arch = _architecture(reader, path)
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(
            f"GGUF file {path} scales RoPE by frequency factors (rope_freqs.weight, as Llama "
            "3.1 and later are converted); not supported"
        )

    def meta(key: str, default: Any = None) -> Any:
        value = _field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF file {path} lacks the metadata field {arch}.{key}")
        return value

    heads = meta("attention.head_count")
    hidden = meta("embedding_length")
    head_dim = meta("attention.key_length", hidden // heads)
    rotary = meta("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise ValueError(
            f"GGUF file {path}: {arch}.rope.dimension_count {rotary} is not the head size "
            f"{head_dim}; partial rotary embeddings are not supported"
        )
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"GGUF file {path}: unsupported {arch}.rope.scaling.type {scaling!r}")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    eos = [_field(reader, f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot")]
    kinds = {t.tensor_type for t in reader.tensors if len(t.shape) == 2}
    dtype = {GGMLQuantizationType.F16: "float16", GGMLQuantizationType.BF16: "bfloat16"}
    return {
        "architectures": [ARCHITECTURES[arch]],
        "vocab_size": meta("vocab_size", None if tokens is None else len(tokens.data)),
        "hidden_size": hidden,
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": _shortest(meta("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": meta("context_length"),
        "rope_theta": _shortest(meta("rope.freq_base", 10000.0)),
        "attention_bias": "blk.0.attn_output.bias" in names,  # Llama's: on q, k, v and o
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": dtype.get(next(iter(kinds))) if len(kinds) == 1 else None,
        "eos_token_id": list(dict.fromkeys(i for i in eos if i is not None)),
        "use_sliding_window": False,
    }


def _shortest(value: float) -> float:
    """A float32 field as the shortest decimal that reads back as it (1e-06, not
    9.999999974752427e-07): the number config.json had before the conversion."""
    return float(str(np.float32(value)))


def hf_name(name: str) -> str:
    """The Hugging Face name of GGUF tensor ``name``; a ValueError for one no model here has."""
    layer = _LAYER.match(name)
    if layer is not None and layer[2] in _LAYER_NAMES:
        return f"model.layers.{layer[1]}.{_LAYER_NAMES[layer[2]]}.{layer[3]}"
    top = _GLOBAL.match(name)
    if top is not None and top[1] in _NAMES:
        return f"{_NAMES[top[1]]}.{top[2]}"
    raise ValueError(f"unsupported GGUF tensor {name!r}")


class GGUFTensors:
    """A GGUF file's tensors under Hugging Face names, opened as ``safetensors.safe_open`` is
    (``keys``, ``get_slice``, ``get_tensor``); each read dequantizes the whole tensor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        reader = _reader(path)
        self.arch = _architecture(reader, path)
        # present: the config (``gguf_config``) read the same fields first and named a missing one
        self.heads = _field(reader, f"{self.arch}.attention.head_count")
        self.kv_heads = _field(reader, f"{self.arch}.attention.head_count_kv", self.heads)
        self.tensors: dict[str, ReaderTensor] = {}
        for tensor in reader.tensors:
            if tensor.tensor_type not in TYPES:
                raise ValueError(
                    f"GGUF tensor {tensor.name!r} in {path} is {tensor.tensor_type.name}, a type "
                    f"not supported; supported: {', '.join(t.name for t in TYPES)}"
                )
            self.tensors[hf_name(tensor.name)] = tensor

    def __enter__(self) -> "GGUFTensors":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.tensors.clear()

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get_tensor(self, name: str) -> torch.Tensor:
        tensor = self.tensors[name]
        values = dequantize(tensor.data, tensor.tensor_type)
        weight = torch.from_numpy(values if values.flags.writeable else np.array(values))
        if self.arch in _PERMUTED_QK:
            if ".q_proj." in name:
                return _unpermute(weight, self.heads)
            if ".k_proj." in name:
                return _unpermute(weight, self.kv_heads)
        return weight

    get_slice = get_tensor


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k permute: its rows of a head run (pair 0: re, im), (pair 1: re,
    im) ...; Hugging Face's run every pair's first half, then every pair's second half."""
    half = weight.shape[0] // heads // 2
    rows = weight.reshape(heads, half, 2, *weight.shape[1:])
    return rows.transpose(1, 2).reshape(weight.shape).contiguous()
