"""Hugging Face safetensors checkpoints (or GGUF files) → a ready DecoderLM, each rank
reading its shard."""

import contextlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.linear import (
    LinearBase,
    Transform,
    default_weight_loader,
    shape_of,
)
from kvserve.engine.layers.moe.fused_moe import FusedMoE
from kvserve.engine.layers.pipeline_parallel import PipelineParallel
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models import registry
from kvserve.engine.models.decoder import DecoderLM
from kvserve.engine.models.gguf_checkpoint import GGUFTensors, gguf_file
from kvserve.engine.models.model_config import ModelConfig

_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")
_QUANTIZED_PARTS = re.compile(
    r"\.(weight_scale|weight_scale_inv|input_scale|qweight|qzeros|scales|g_idx|weight_packed)$"
)
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
    """The safetensors files of a checkpoint, sharded (with an index) or not; or its one GGUF
    file."""
    gguf = gguf_file(path)
    if gguf is not None:
        return [gguf]
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
    pp: PipelineParallel | None = None,
) -> DecoderLM:
    """Build the model of ``cfg``'s architecture for rank ``tp.rank`` without initialising
    it, then hand every checkpoint tensor, as a safetensors slice, to its parameter's weight
    loader, which reads this rank's shard of it alone; then finish each linear's weights
    (prepacked for the CPU kernels if ``packed``: see ``packed_linear.can_pack``). Fails if
    a weight is missing (but for an ``optional`` one: an FP8 KV cache's scales) or unknown.
    ``pp``: the pipeline stage it is (its parts alone are kept and read)."""
    path = Path(path)
    with torch.device(device), _default_dtype(dtype):
        model = registry.model_class(cfg.architecture)(cfg, backend, max_positions, tp)
    everything = set(dict(model.named_parameters()))
    pp = pp or PipelineParallel()
    if pp.size > 1:
        model.keep_stage(pp)
    params = dict(model.named_parameters())
    renames = _checkpoint_names(model)
    tensors = model.checkpoint_tensors()
    loaded: dict[str, set] = {name: set() for name in params}
    files = checkpoint_files(path)
    has_lm_head = False
    # a last stage without the embedding takes a tied LM head from the embedding's tensor
    tied_head = pp.size > 1 and pp.is_last and not pp.is_first and _tied(cfg, files)
    for done, file in enumerate(files, start=1):
        opened = GGUFTensors(file) if file.suffix == ".gguf" else safe_open(str(file), "pt")
        with opened as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                if _IGNORED.match(name):
                    continue
                ours = model.checkpoint_name(name)
                if ours is None:
                    continue
                has_lm_head |= ours == "lm_head.weight"
                target, shard_id = _target(ours, tensors)
                target, transform = renames.get(target, (target, None))
                if tied_head and target == "embed_tokens.weight":
                    target = "lm_head.weight"
                param = params.get(target)
                if param is None and target in everything:
                    continue  # another pipeline stage's
                if param is None:
                    raise ValueError(f"unexpected weight {name!r} in {path}{_why(cfg, name)}")
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                try:
                    if transform is None:
                        weight_loader(param, handle.get_slice(name), shard_id)
                    else:
                        weight_loader(param, transform(handle.get_tensor(name)), shard_id)
                except (RuntimeError, ValueError) as e:
                    shape = list(shape_of(handle.get_slice(name)))
                    raise ValueError(
                        f"checkpoint tensor {name!r} (shape {shape}) does not fit {target} "
                        f"(this rank's part: {list(param.shape)}): {e}"
                    ) from e
                loaded[target].add(shard_id)
        if progress is not None:
            progress(done, len(files))
    tied = cfg.tie_word_embeddings if cfg.tie_word_embeddings is not None else not has_lm_head
    if tied and "embed_tokens.weight" in params and "lm_head.weight" in params:
        model.lm_head.tie(model.embed_tokens)
        loaded["lm_head.weight"] = loaded["embed_tokens.weight"]
    missing = [
        n
        for n, p in params.items()
        if loaded[n] != getattr(p, "shard_ids", {None}) and not getattr(p, "optional", False)
    ]
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights for: {', '.join(missing[:5])}")
    kernels = "triton" if backend.name == "triton" else "cpu-packed" if packed else "torch"
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.build(dtype, device)
        elif isinstance(module, LinearBase):
            module.method.process_weights_after_loading(module, kernels)
        elif isinstance(module, FusedMoE):
            module.process_weights_after_loading(kernels)
    return model.eval()


def _tied(cfg: ModelConfig, files: list[Path]) -> bool:
    """The LM head is the embedding: config.json says so, or the checkpoint has no head."""
    if cfg.tie_word_embeddings is not None:
        return cfg.tie_word_embeddings
    for file in files:
        opened = GGUFTensors(file) if file.suffix == ".gguf" else safe_open(str(file), "pt")
        with opened as handle:
            if "lm_head.weight" in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                return False
    return True


def _checkpoint_names(model: DecoderLM) -> dict[str, tuple[str, Transform | None]]:
    """Checkpoint tensor names that a linear's weight method stores under another name
    (``q_proj.qweight`` → ``qkv_proj.qvalue``), with the function that converts them."""
    renames = {}
    for prefix, module in model.named_modules():
        if isinstance(module, LinearBase):
            for stored, (ours, transform) in module.method.checkpoint_names.items():
                renames[f"{prefix}.{stored}"] = (f"{prefix}.{ours}", transform)
    return renames


def _why(cfg: ModelConfig, name: str) -> str:
    """Why a checkpoint tensor nobody takes may be there."""
    if cfg.quantization is None and _QUANTIZED_PARTS.search(name):
        return (
            "; it looks like a quantized checkpoint's tensor, but config.json has no "
            "quantization_config"
        )
    if cfg.quantization is not None:
        return f" (quantization: {cfg.quantization.describe()})"
    return ""


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Parameters created inside are ``dtype``."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _target(name: str, tensors: Mapping[str, tuple[str, Any]]) -> tuple[str, Any]:
    """Checkpoint name → (our parameter name, the shard of it the tensor fills: q/k/v of the
    fused q/k/v projection, 0/1 for gate/up, None for a whole parameter, or what the model's
    ``checkpoint_tensors`` says for the tensors it names)."""
    match = _LAYER.match(name)
    if match is None:
        return name.removeprefix("model."), None
    layer, rest = match.groups()
    if rest in tensors:
        target, shard_id = tensors[rest]
        return f"layers.{layer}.{target}", shard_id
    rest = _KV_SCALES.get(rest, rest)
    module, _, kind = rest.rpartition(".")
    if module in _FUSED:
        target, shard_id = _FUSED[module]
        return f"layers.{layer}.{target}.{kind}", shard_id
    return f"layers.{layer}.{rest}", None
