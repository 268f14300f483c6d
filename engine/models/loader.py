"""Hugging Face safetensors checkpoints → a ready DecoderLM."""

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from kvserve.engine.attention.backend import AttentionBackend
from kvserve.engine.models.decoder import DecoderLM
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.packed_linear import pack_linears

_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint, sharded (with an index) or not."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / name for name in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in model directory {path}")
    return files


def iter_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield name, handle.get_tensor(name)


def load_model(
    path: str | Path,
    cfg: ModelConfig,
    backend: AttentionBackend,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    progress: Callable[[int, int], None] | None = None,
    packed: bool = False,
) -> DecoderLM:
    """Build the model without initialising it, then copy every checkpoint tensor
    into its (possibly fused) parameter, and prepack its linears if ``packed`` (see
    ``packed_linear.can_pack``). Fails if a weight is missing or unknown."""
    path = Path(path)
    with torch.device("meta"):
        model = DecoderLM(cfg, backend, max_positions)
    model = model.to_empty(device=device).to(dtype)
    params = dict(model.named_parameters())
    rows_filled = dict.fromkeys(params, 0)
    files = checkpoint_files(path)
    has_lm_head = False
    for done, file in enumerate(files, start=1):
        for name, tensor in iter_weights([file]):
            if _IGNORED.match(name):
                continue
            has_lm_head |= name == "lm_head.weight"
            target, rows = _target(name, cfg)
            if target not in params:
                raise ValueError(f"unexpected weight {name!r} in {path}")
            with torch.no_grad():
                params[target][rows].copy_(tensor)
            rows_filled[target] += tensor.shape[0]
        if progress is not None:
            progress(done, len(files))
    tied = cfg.tie_word_embeddings if cfg.tie_word_embeddings is not None else not has_lm_head
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
        rows_filled["lm_head.weight"] = cfg.vocab_size
    missing = [n for n, p in params.items() if rows_filled[n] != p.shape[0]]
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for: {', '.join(missing[:5])}")
    model.rotary.build(dtype, device)
    if packed:
        pack_linears(model)
    return model.eval()


def _target(name: str, cfg: ModelConfig) -> tuple[str, slice]:
    """Checkpoint name → (our parameter name, the rows it fills)."""
    whole = slice(None)
    match = _LAYER.match(name)
    if match is None:
        return name.removeprefix("model."), whole
    layer, rest = match.groups()
    prefix = f"layers.{layer}."
    q, kv, inter = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    )
    fused = {
        "self_attn.q_proj": ("self_attn.qkv_proj", slice(0, q)),
        "self_attn.k_proj": ("self_attn.qkv_proj", slice(q, q + kv)),
        "self_attn.v_proj": ("self_attn.qkv_proj", slice(q + kv, q + 2 * kv)),
        "mlp.gate_proj": ("mlp.gate_up_proj", slice(0, inter)),
        "mlp.up_proj": ("mlp.gate_up_proj", slice(inter, 2 * inter)),
    }
    module, _, kind = rest.rpartition(".")
    if module in fused:
        target, rows = fused[module]
        return f"{prefix}{target}.{kind}", rows
    return prefix + rest, whole
