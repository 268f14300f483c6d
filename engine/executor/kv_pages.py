"""One rank's KV cache tensors: a page of keys and one of values per block id, viewed as
each attention layer's cache."""

import torch

from kvserve.engine.core.kv_groups import KVGroup, held_pages
from kvserve.engine.layers.attention.layer import KVCache
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.model_config import ModelConfig


def layer_caches(
    cfg: ModelConfig,
    groups: tuple[KVGroup, ...],
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    tp: TensorParallel,
    stage: range | None = None,
) -> tuple[list[KVCache], list[int]]:
    """Each layer's (key, value) cache ``[num_blocks, block_size, its kv heads on this rank,
    its head size]`` and its group's index: a group's ``i``-th layer keeps its keys and values
    in the ``i``-th slice of every block's page. Of one shape, the slices are whole tensors
    (contiguous); of several, a block's page holds its layers' slices one after another, so
    a layer's cache steps from block to block by the page (a strided view). A layer in no
    group reads its owner's (KV-shared; ``ModelConfig.kv_owners``), or gets the first
    group's first as a placeholder (linear attention: its state slots replace it)."""
    shapes = [cfg.kv_shape(group.layers[0]) for group in groups]
    shapes = [(tp.kv_heads(heads), dim) for heads, dim in shapes]
    layer_groups = [0] * cfg.num_layers
    per_layer: dict[int, KVCache] = {}
    if len(set(shapes)) == 1:
        size = max(len(g.layers) for g in groups)
        shape = (num_blocks, block_size, *shapes[0])
        held = range(size) if stage is None else held_pages(groups, stage)
        none = torch.empty(0, dtype=dtype, device=device)
        pairs = [
            (
                torch.zeros(shape, dtype=dtype, device=device),
                torch.zeros(shape, dtype=dtype, device=device),
            )
            if position in held
            else (none, none)
            for position in range(size)
        ]
        for index, group in enumerate(groups):
            for position, layer in enumerate(group.layers):
                per_layer[layer], layer_groups[layer] = pairs[position], index
    else:
        if stage is not None:
            raise ValueError("a pipeline stage of a model with KV pages of several shapes")
        sizes = zip(groups, shapes, strict=True)
        page = max(len(group.layers) * heads * dim for group, (heads, dim) in sizes)
        keys = torch.zeros((num_blocks, block_size * page), dtype=dtype, device=device)
        values = torch.zeros_like(keys)
        for index, (group, (heads, dim)) in enumerate(zip(groups, shapes, strict=True)):
            width = block_size * heads * dim
            for position, layer in enumerate(group.layers):
                part = slice(position * width, (position + 1) * width)
                view = (num_blocks, block_size, heads, dim)
                per_layer[layer] = (keys[:, part].view(view), values[:, part].view(view))
                layer_groups[layer] = index
    first = per_layer[groups[0].layers[0]]
    caches = [per_layer.get(layer, first) for layer in range(cfg.num_layers)]
    for layer in cfg.kv_shared_layers:
        owner = cfg.kv_owners[layer]
        caches[layer], layer_groups[layer] = caches[owner], layer_groups[owner]
    return caches, layer_groups
