"""How the engine runs its model, decided once from the settings, the checkpoint and the
device, logged in one line and handed around as one object."""

import dataclasses
import math
from dataclasses import dataclass

import torch

from kvserve.engine.cdiv import cdiv
from kvserve.engine.config import DTYPES, EngineConfig
from kvserve.engine.core.kv_groups import (
    FULL,
    LINEAR,
    SHARED,
    SLIDING,
    KVGroup,
    LayerKind,
    group_size,
    held_pages,
    kv_groups,
    page_elements,
)
from kvserve.engine.graphs.cpu_graphs import use_cpu_graphs
from kvserve.engine.graphs.cuda_graphs import use_cuda_graphs
from kvserve.engine.kernels.cpu_isa import cpu_flags, native_bf16
from kvserve.engine.kv_cache_sizing import (
    configured_kv_blocks,
    cuda_kv_cache_blocks,
    kv_block_bytes,
)
from kvserve.engine.layers.attention.backend import AttentionBackend, select_backend
from kvserve.engine.layers.attention.fp8_kv import FP8, kv_cache_dtype
from kvserve.engine.layers.cpu_linear.packed_linear import can_pack
from kvserve.engine.layers.pipeline_parallel import PipelineParallel
from kvserve.engine.models.decoder import DecoderLM
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.models.registry import model_class
from kvserve.engine.spec_decode.draft_kv import draft_kv_block_bytes


@dataclass(frozen=True)
class ExecutionPlan:
    """Every decision the settings leave to the engine, made by ``plan_execution``.

    ``num_kv_blocks`` is None only between ``plan_execution`` and ``with_measured_kv_blocks``
    on a CUDA device whose cache is the share of memory a profiled step leaves (that needs
    the loaded model); every plan past the model runner's construction has it.
    """

    model: str
    family: str
    device: torch.device
    dtype: torch.dtype
    dtype_note: str
    """Why ``auto`` chose a dtype other than the checkpoint's (empty when it did not)."""
    weights: str
    """The linear layers' quantization (``QuantConfig.describe``); empty for 16-bit ones."""
    backend: AttentionBackend
    cuda_graphs: bool
    cpu_graphs: bool
    packed_linears: bool
    max_model_len: int
    block_size: int
    kv_cache_dtype: torch.dtype
    """The KV cache's elements: ``dtype``'s, or e4m3 (``--kv-cache-dtype fp8``)."""
    kv_block_bytes: int
    num_kv_blocks: int | None
    kv_groups: tuple[KVGroup, ...]
    """The attention layers' block-table groups (``kv_groups``): one for a dense model."""
    max_blocks_held_per_seq: int
    """The most blocks of all groups one request holds at the full context (a sliding
    window's group holds its window's, whatever the context)."""
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    """The step's limits: the config's, or where it sets none the device's
    (``EngineConfig.batch_limits``)."""
    num_state_slots: int = 0
    """Recurrent-state slots of a model with linear-attention layers, one per sequence that
    may run (``max_num_seqs``; a step is never padded, so no scratch slot); 0 without."""
    state_slot_bytes: int = 0
    """One slot's bytes on this rank: the conv and ssm states of every linear-attention
    layer. The slots' memory comes off the KV cache's budget."""

    @property
    def max_blocks_per_seq(self) -> int:
        """Entries of a request's block table at the full context."""
        return cdiv(self.max_model_len, self.block_size)

    def with_measured_kv_blocks(self, model: DecoderLM, config: EngineConfig) -> "ExecutionPlan":
        """This plan with the blocks that fit next to ``model`` and its largest step."""
        blocks = cuda_kv_cache_blocks(
            model,
            config,
            self.max_model_len,
            self.kv_block_bytes,
            self.kv_cache_dtype,
            self.device,
            self.num_state_slots * self.state_slot_bytes,
        )
        return dataclasses.replace(self, num_kv_blocks=blocks)

    def __str__(self) -> str:
        on_off = {True: "on", False: "off"}
        return (
            f"{self.model} ({self.family}): device {self.device}, "
            f"dtype {str(self.dtype).removeprefix('torch.')}"
            f"{f' ({self.dtype_note})' if self.dtype_note else ''}, "
            f"{f'weights {self.weights}, ' if self.weights else ''}"
            f"attention {self.backend.name}, "
            f"cuda graphs {on_off[self.cuda_graphs]}, "
            f"cpu graphs {on_off[self.cpu_graphs]}, "
            f"packed linears {on_off[self.packed_linears]}, "
            f"max_model_len {self.max_model_len}, "
            f"{'kv fp8, ' if self.kv_cache_dtype == FP8 else ''}"
            f"{self.num_kv_blocks} KV blocks x {self.block_size} tokens"
            f"{self._groups_note()}"
            f"{self._slots_note()}"
        )

    def _slots_note(self) -> str:
        if not self.num_state_slots:
            return ""
        mib = self.num_state_slots * self.state_slot_bytes / 2**20
        return (
            f", {self.num_state_slots} state slots x {self.state_slot_bytes} bytes "
            f"({mib:.1f} MiB) for the linear-attention layers"
        )

    def _groups_note(self) -> str:
        """Nothing for one group; else each kind's groups and what a request holds."""
        if len(self.kv_groups) == 1:
            return ""
        kinds: dict[str, int] = {}
        for group in self.kv_groups:
            name = group.kind if group.window is None else f"{group.kind} {group.window}"
            kinds[name] = kinds.get(name, 0) + 1
        size = f"{group_size(self.kv_groups)}"
        if len({len(group.layers) for group in self.kv_groups}) > 1:  # a shorter last group,
            size = f"up to {size}"  # or more layers of a smaller shape
        listed = ", ".join(f"{count} {name}" for name, count in kinds.items())
        return (
            f" shared by {len(self.kv_groups)} groups of {size} layers ({listed}); a request "
            f"at max_model_len holds {self.max_blocks_held_per_seq} of them"
        )


def plan_execution(
    config: EngineConfig,
    model_config: ModelConfig,
    flags: frozenset[str] | None = None,
    rank: int = 0,
) -> ExecutionPlan:
    """Resolve ``config``'s ``auto`` settings for this checkpoint on this machine (``flags``:
    its CPU's feature flags, read from /proc/cpuinfo unless given) for world rank ``rank``
    (with several pipeline stages a block holds the KV pages of its stage's layers alone);
    raises ValueError for a setting the checkpoint or the device cannot honour."""
    device = _device(config)
    max_num_seqs, max_num_batched_tokens = config.batch_limits(device.type)
    tp, local = config.tensor_parallel_size, config.local_world_size
    if device.type == "cuda" and local > 1 and local > torch.cuda.device_count():
        raise ValueError(
            f"tensor_parallel_size {tp} needs {local} CUDA devices, one per rank; this machine "
            f"has {torch.cuda.device_count()}"
        )
    cpu_bf16 = native_bf16(cpu_flags() if flags is None else flags)
    dtype, dtype_note = _dtype(config.dtype, model_config.torch_dtype, device, cpu_bf16)
    backend = select_backend(device, config.attention_backend)
    max_model_len = _max_model_len(config, model_config)
    kv_dtype = _kv_cache_dtype(config.kv_cache_dtype, dtype, device, backend)
    groups = kv_groups(layer_kinds(model_config))
    elements = page_elements(groups)
    if config.pipeline_parallel_size > 1:
        model_class(model_config.architecture).check_pipeline(
            model_config, config.pipeline_parallel_size
        )
        stage = PipelineParallel.of_rank(rank, tp, config.pipeline_parallel_size)
        pages = held_pages(groups, stage.layers(model_config.num_layers))
        elements = len(pages) * groups[0].token_elements  # staged models: one page shape
    block_bytes = kv_block_bytes(config.block_size, kv_dtype, elements)
    block_bytes += draft_kv_block_bytes(config, config.block_size, kv_dtype)
    held = sum(
        g.max_blocks(max_model_len, config.block_size, max_num_batched_tokens) for g in groups
    )
    linear = model_config.gated_delta_net
    slots = max_num_seqs if linear is not None else 0
    slot_bytes = (
        len(model_config.linear_layers) * linear.state_spec(tp, dtype).bytes_per_slot
        if linear is not None
        else 0
    )
    # CUDA graphs and recorded CPU decode steps were never proven with collectives inside:
    # a model sharded over several ranks runs every step eagerly; nor with LoRA layers (a
    # step's adapter row groups are not part of a replayed step). Several KV groups and state
    # slots have static buffers of their own (graphs/static_batch.py), but a CUDA graph's
    # padding rows would need a scratch state slot: state-slot models record CPU steps only.
    eager = config.enforce_eager or config.world_size > 1 or config.enable_lora
    return ExecutionPlan(
        model=config.model,
        family=model_config.family,
        device=device,
        dtype=dtype,
        dtype_note=dtype_note,
        weights=quant.describe() if (quant := model_config.quantization) else "",
        backend=backend,
        cuda_graphs=use_cuda_graphs(device, backend.name, eager or slots > 0),
        cpu_graphs=use_cpu_graphs(device, backend.name, eager),
        packed_linears=can_pack(dtype, device),
        max_model_len=max_model_len,
        block_size=config.block_size,
        kv_cache_dtype=kv_dtype,
        kv_block_bytes=block_bytes,
        num_kv_blocks=configured_kv_blocks(config, block_bytes, held, device, slots * slot_bytes),
        kv_groups=groups,
        max_blocks_held_per_seq=held,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        num_state_slots=slots,
        state_slot_bytes=slot_bytes,
    )


def layer_kinds(model_config: ModelConfig) -> tuple[LayerKind, ...]:
    """Each layer's memory: a state slot for ``linear_layers``, another layer's cache for
    ``kv_shared_layers``, else its window from ``layer_windows``, else full attention, of
    its kv heads x head size elements a token."""
    windows = model_config.layer_windows or (None,) * model_config.num_layers
    shared = model_config.kv_shared_layers
    return tuple(
        LayerKind(LINEAR)
        if i in model_config.linear_layers
        else LayerKind(SHARED)
        if i in shared
        else LayerKind(FULL if w is None else SLIDING, w, math.prod(model_config.kv_shape(i)))
        for i, w in enumerate(windows)
    )


def _device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def _dtype(
    name: str, checkpoint_dtype: str | None, device: torch.device, cpu_bf16: bool
) -> tuple[torch.dtype, str]:
    """An explicit dtype is obeyed. ``auto`` takes the checkpoint's, except on a CPU: a half
    precision checkpoint computes in bfloat16 where the CPU does bf16 natively (AMX,
    AVX-512-BF16) and is upcast to float32 elsewhere (emulated bf16 matmuls run several
    times slower than float32 there); float16 always becomes one of those two (it is
    emulated on every CPU). Returns the dtype and why it differs from the checkpoint's."""
    if name != "auto":
        return getattr(torch, name), ""
    stored = checkpoint_dtype if checkpoint_dtype in DTYPES else "float32"
    if device.type != "cpu" or stored == "float32" or (stored == "bfloat16" and cpu_bf16):
        return getattr(torch, stored), ""
    if cpu_bf16:
        return torch.bfloat16, f"{stored} checkpoint: bfloat16 is native on this CPU"
    return torch.float32, f"{stored} checkpoint upcast: this CPU has no native bf16"


def _kv_cache_dtype(
    setting: str, dtype: torch.dtype, device: torch.device, backend: AttentionBackend
) -> torch.dtype:
    """The cache's element type; e4m3 is refused where the Triton kernels cannot convert to
    it (CUDA devices before compute capability 8.9)."""
    kv_dtype = kv_cache_dtype(setting, dtype)
    if kv_dtype == FP8 and device.type == "cuda" and backend.name == "triton":
        capability = torch.cuda.get_device_capability(device)
        if capability < (8, 9):
            raise ValueError(
                f"kv_cache_dtype {setting} needs a GPU of compute capability 8.9 or newer for "
                f"the Triton kernels' e4m3 (this one is {capability[0]}.{capability[1]}); "
                "use kv_cache_dtype auto or attention_backend torch"
            )
    return kv_dtype


def _max_model_len(config: EngineConfig, model_config: ModelConfig) -> int:
    """The setting, or the model's context, never above it (a sliding window caps nothing:
    its layers' blocks leave the cache as they leave the window)."""
    limit = model_config.max_position_embeddings
    wanted = config.max_model_len or limit
    if wanted > limit:
        raise ValueError(f"max_model_len {wanted} exceeds the model's context of {limit}")
    return wanted
