"""How many KV blocks the engine gets; every rule of it lives here.

``num_kv_blocks`` wins; else a budget of ``kv_cache_memory_gb`` over the bytes of a block;
else on a CPU what ``max_num_seqs`` full contexts need, within DEFAULT_CPU_KV_CACHE_GB.
On CUDA without either, as in vLLM, ``gpu_memory_utilization`` is the share of the
device's whole memory the engine may use: the weights, the peak activations of the
largest step (measured by running one on a one-block cache) and memory held outside torch
(CUDA context, other processes) come off it first, and the rest becomes KV blocks.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvserve.engine.cdiv import cdiv
from kvserve.engine.config import EngineConfig
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.models.decoder import DecoderLM

log = logging.getLogger(__name__)
GIB = 2**30
DEFAULT_CPU_KV_CACHE_GB = 4.0


def kv_block_bytes(block_size: int, dtype: torch.dtype, page_elements: int) -> int:
    """Bytes of one block: keys and values of ``block_size`` tokens in one page of
    ``page_elements`` elements a token (``kv_groups.page_elements``: a dense model's layers
    x kv heads x head size), each element a ``dtype`` (the cache's: 1 byte for e4m3, so
    twice a 16-bit cache's blocks fit in one budget)."""
    return 2 * block_size * page_elements * dtype.itemsize


def configured_kv_blocks(
    config: EngineConfig,
    block_bytes: int,
    blocks_per_seq: int,
    device: torch.device,
    state_bytes: int = 0,
) -> int | None:
    """The blocks the settings fix without measuring (``blocks_per_seq``: those one request
    holds at the full context); None where they are the share of a CUDA device's memory
    left after a profiled step (``cuda_kv_cache_blocks``). ``state_bytes``: the
    linear-attention layers' state slots, which come off a budget first."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    if config.kv_cache_memory_gb is not None:
        blocks = (int(config.kv_cache_memory_gb * GIB) - state_bytes) // block_bytes
        if blocks < 1:
            raise ValueError(f"a KV budget of {config.kv_cache_memory_gb:.3f} GiB holds no block")
        return blocks
    if device.type == "cuda":
        return None
    full_contexts = config.batch_limits(device.type)[0] * blocks_per_seq
    return min(full_contexts, (int(DEFAULT_CPU_KV_CACHE_GB * GIB) - state_bytes) // block_bytes)


@dataclass(frozen=True)
class MemoryProfile:
    """Device memory once the weights are loaded and the profiling step has run."""

    total_bytes: int
    peak_torch_bytes: int  # the torch allocator's peak: weights and the step's activations
    non_torch_bytes: int  # in use outside torch's pool: CUDA context, other processes


def kv_cache_blocks(
    profile: MemoryProfile, utilization: float, block_bytes: int, state_bytes: int = 0
) -> int:
    """Blocks of ``block_bytes`` in ``utilization`` of the device, less what is in use and
    the ``state_bytes`` of the linear-attention layers' state slots."""
    budget = int(profile.total_bytes * utilization)
    free = budget - profile.peak_torch_bytes - profile.non_torch_bytes - state_bytes
    blocks = max(free, 0) // block_bytes
    log.info(
        "KV cache: %d blocks (%.2f GiB) = %.2f GiB (%.2f of %.2f GiB) - %.2f GiB weights and "
        "activations - %.2f GiB outside torch",
        blocks,
        blocks * block_bytes / GIB,
        budget / GIB,
        utilization,
        profile.total_bytes / GIB,
        profile.peak_torch_bytes / GIB,
        profile.non_torch_bytes / GIB,
    )
    if blocks < 1:
        raise ValueError(
            f"gpu_memory_utilization {utilization} leaves no room for a KV block: "
            f"{budget / GIB:.2f} GiB allowed, {profile.peak_torch_bytes / GIB:.2f} GiB for the "
            f"weights and activations, {profile.non_torch_bytes / GIB:.2f} GiB outside torch; "
            "raise it or lower max_num_batched_tokens"
        )
    return blocks


def profile_query_lens(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int):
    """The largest step the scheduler can make, as fresh prompts: the whole token budget
    over as many sequences as may run (the most logits rows), none past the context."""
    tokens = min(max_num_batched_tokens, max_num_seqs * max_model_len)
    num_seqs = min(max_num_seqs, tokens)
    base, extra = divmod(tokens, num_seqs)
    return [base + 1] * extra + [base] * (num_seqs - extra)


def profile_step(
    model: DecoderLM,
    query_lens: list[int],
    block_size: int,
    kv_dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Run ``query_lens`` fresh prompts through ``model`` on a one-block KV cache of
    ``kv_dtype`` (every token's slot wraps around in it; the outputs are meaningless, their
    memory is real) and return the logits of each sequence's last token. Linear-attention
    layers share one state slot per sequence (the slots' memory is counted apart)."""
    cfg = model.config
    num_tokens = sum(query_lens)
    kv_caches = [
        (
            torch.zeros((1, block_size, *cfg.kv_shape(i)), dtype=kv_dtype, device=device),
            torch.zeros((1, block_size, *cfg.kv_shape(i)), dtype=kv_dtype, device=device),
        )
        for i in range(cfg.num_layers)
    ]
    lens = torch.tensor(query_lens, dtype=torch.int32)
    ends = lens.cumsum(0)
    starts = ends - lens
    positions = torch.arange(num_tokens) - torch.repeat_interleave(starts, lens)
    max_len = max(query_lens)
    meta = AttentionMetadata(
        slot_mapping=(torch.arange(num_tokens) % block_size).to(device),
        query_start_loc=torch.cat([starts[:1], ends]).to(torch.int32).to(device),
        seq_lens=lens.to(device),
        block_tables=torch.zeros(len(query_lens), cdiv(max_len, block_size), dtype=torch.int32).to(
            device
        ),
        query_lens_host=list(query_lens),
        seq_lens_host=list(query_lens),
        max_query_len=max_len,
        max_seq_len=max_len,
    )
    input_ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    metas: list[AttentionMetadata | StateMetadata] = [meta] * cfg.num_layers
    if cfg.gated_delta_net is not None:
        spec = cfg.gated_delta_net.state_spec(model.tp.size, model.embed_tokens.weight.dtype)
        states = spec.allocate(len(query_lens), device)
        state_meta = StateMetadata(
            query_start_loc=meta.query_start_loc,
            state_slots=torch.arange(len(query_lens), dtype=torch.int32, device=device),
            has_initial_state=torch.zeros(len(query_lens), dtype=torch.bool, device=device),
            query_start_loc_host=[0, *ends.tolist()],
        )
        for layer in cfg.linear_layers:
            kv_caches[layer], metas[layer] = states, state_meta
    hidden = model(input_ids, positions.to(device), kv_caches, metas)
    return model.logits(hidden[(ends - 1).to(device)])


def measure_cuda_memory(device: torch.device, run: Callable[[], object]) -> MemoryProfile:
    """Profile ``run()`` (a step on the loaded model) on a CUDA device."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    profile = MemoryProfile(
        total_bytes=total,
        peak_torch_bytes=torch.cuda.max_memory_allocated(device),
        non_torch_bytes=total - free - torch.cuda.memory_reserved(device),
    )
    torch.cuda.empty_cache()
    return profile


@torch.inference_mode()
def cuda_kv_cache_blocks(
    model: DecoderLM,
    config: EngineConfig,
    max_model_len: int,
    block_bytes: int,
    kv_dtype: torch.dtype,
    device: torch.device,
    state_bytes: int = 0,
) -> int:
    """Profile the largest step of ``config`` on the loaded ``model`` and size the cache
    (of ``kv_dtype``) next to ``state_bytes`` of state slots."""
    max_num_seqs, max_num_batched_tokens = config.batch_limits(device.type)
    lens = profile_query_lens(max_num_batched_tokens, max_num_seqs, max_model_len)
    profile = measure_cuda_memory(
        device, lambda: profile_step(model, lens, config.block_size, kv_dtype, device)
    )
    return kv_cache_blocks(profile, config.gpu_memory_utilization, block_bytes, state_bytes)
