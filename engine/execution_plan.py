"""How the engine runs its model, decided once from the settings, the checkpoint and the
device, logged in one line and handed around as one object."""

import dataclasses
from dataclasses import dataclass

import torch

from kvserve.engine.cdiv import cdiv
from kvserve.engine.config import DTYPES, EngineConfig
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
from kvserve.engine.models.decoder import DecoderLM
from kvserve.engine.models.model_config import ModelConfig


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

    @property
    def max_blocks_per_seq(self) -> int:
        """Blocks of a request at the full context."""
        return cdiv(self.max_model_len, self.block_size)

    def with_measured_kv_blocks(self, model: DecoderLM, config: EngineConfig) -> "ExecutionPlan":
        """This plan with the blocks that fit next to ``model`` and its largest step."""
        blocks = cuda_kv_cache_blocks(
            model, config, self.max_model_len, self.kv_block_bytes, self.kv_cache_dtype, self.device
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
        )


def plan_execution(
    config: EngineConfig, model_config: ModelConfig, flags: frozenset[str] | None = None
) -> ExecutionPlan:
    """Resolve ``config``'s ``auto`` settings for this checkpoint on this machine (``flags``:
    its CPU's feature flags, read from /proc/cpuinfo unless given); raises ValueError for a
    setting the checkpoint or the device cannot honour."""
    device = _device(config)
    tp = config.tensor_parallel_size
    if device.type == "cuda" and tp > 1 and tp > torch.cuda.device_count():
        raise ValueError(
            f"tensor_parallel_size {tp} needs {tp} CUDA devices, one per rank; this machine "
            f"has {torch.cuda.device_count()}"
        )
    cpu_bf16 = native_bf16(cpu_flags() if flags is None else flags)
    dtype, dtype_note = _dtype(config.dtype, model_config.torch_dtype, device, cpu_bf16)
    backend = select_backend(device, config.attention_backend)
    max_model_len = _max_model_len(config, model_config)
    kv_dtype = _kv_cache_dtype(config.kv_cache_dtype, dtype, device, backend)
    block_bytes = kv_block_bytes(model_config, config.block_size, kv_dtype)
    # CUDA graphs and recorded CPU decode steps were never proven with collectives inside:
    # a model sharded over several ranks runs every step eagerly; so does one with LoRA
    # layers (a step's adapter row groups are not part of a replayed step)
    eager = config.enforce_eager or tp > 1 or config.enable_lora
    return ExecutionPlan(
        model=config.model,
        family=model_config.family,
        device=device,
        dtype=dtype,
        dtype_note=dtype_note,
        weights=quant.describe() if (quant := model_config.quantization) else "",
        backend=backend,
        cuda_graphs=use_cuda_graphs(device, backend.name, eager),
        cpu_graphs=use_cpu_graphs(device, backend.name, eager),
        packed_linears=can_pack(dtype, device),
        max_model_len=max_model_len,
        block_size=config.block_size,
        kv_cache_dtype=kv_dtype,
        kv_block_bytes=block_bytes,
        num_kv_blocks=configured_kv_blocks(config, block_bytes, max_model_len, device),
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
    """The setting, or the model's context (capped at its sliding window), never above it."""
    limit = model_config.max_position_embeddings
    if model_config.sliding_window:
        limit = min(limit, model_config.sliding_window)
    wanted = config.max_model_len or limit
    if wanted > limit:
        raise ValueError(f"max_model_len {wanted} exceeds the model's context of {limit}")
    return wanted
