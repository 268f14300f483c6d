"""Hugging Face safetensors checkpoints → a ready DecoderLM, each rank reading its shard."""

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.linear import LinearBase, default_weight_loader
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models import registry
from kvserve.engine.models.decoder import DecoderLM
from kvserve.engine.models.model_config import ModelConfig

_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_FUSED: dict[str, tuple[str, str | int]] = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
# An FP8 KV cache's per-tensor scales as ModelOpt and older exports name them (compressed-
# tensors writes self_attn.k_scale / v_scale, our own names).
_KV_SCALES = {
    "self_attn.k_proj.k_scale": "self_attn.k_scale",
    "self_attn.v_proj.v_scale": "self_attn.v_scale",
}


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


def load_model(
    path: str | Path,
    cfg: ModelConfig,
    backend: AttentionBackend,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    progress: Callable[[int, int], None] | None = None,
    packed: bool = False,
    tp: TensorParallel = TensorParallel(),
) -> DecoderLM:
    """Build the model of ``cfg``'s architecture for rank ``tp.rank`` without initialising
    it, then hand every checkpoint tensor, as a safetensors slice, to its parameter's weight
    loader, which reads this rank's shard of it alone; then finish each linear's weights
    (prepacked for the CPU kernels if ``packed``: see ``packed_linear.can_pack``). Fails if
    a weight is missing (but for an ``optional`` one: an FP8 KV cache's scales) or unknown."""
    path = Path(path)
    with torch.device(device), _default_dtype(dtype):
        model = registry.model_class(cfg.architecture)(cfg, backend, max_positions, tp)
    params = dict(model.named_parameters())
    loaded: dict[str, set] = {name: set() for name in params}
    files = checkpoint_files(path)
    has_lm_head = False
    for done, file in enumerate(files, start=1):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                if _IGNORED.match(name):
                    continue
                has_lm_head |= name == "lm_head.weight"
                target, shard_id = _target(name)
                param = params.get(target)
                if param is None:
                    raise ValueError(f"unexpected weight {name!r} in {path}")
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                weight_loader(param, handle.get_slice(name), shard_id)
                loaded[target].add(shard_id)
        if progress is not None:
            progress(done, len(files))
    tied = cfg.tie_word_embeddings if cfg.tie_word_embeddings is not None else not has_lm_head
    if tied:
        model.lm_head.tie(model.embed_tokens)
        loaded["lm_head.weight"] = loaded["embed_tokens.weight"]
    missing = [
        n
        for n, p in params.items()
        if loaded[n] != getattr(p, "shard_ids", {None}) and not getattr(p, "optional", False)
    ]
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for: {', '.join(missing[:5])}")
    model.rotary.build(dtype, device)
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.method.process_weights_after_loading(module, packed)
    return model.eval()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Parameters created inside are ``dtype``."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _target(name: str) -> tuple[str, str | int | None]:
    """Checkpoint name → (our parameter name, the shard of it the tensor fills: q/k/v of the
    fused q/k/v projection, 0/1 for gate/up, None for a whole parameter)."""
    match = _LAYER.match(name)
    if match is None:
        return name.removeprefix("model."), None
    layer, rest = match.groups()
    rest = _KV_SCALES.get(rest, rest)
    module, _, kind = rest.rpartition(".")
    if module in _FUSED:
        target, shard_id = _FUSED[module]
        return f"layers.{layer}.{target}.{kind}", shard_id
    return f"layers.{layer}.{rest}", None
