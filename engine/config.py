"""Engine settings, validated once with messages that name the setting."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvserve.engine.kv_events import KVEventsConfig

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
"""torch dtype names; torch itself is imported only when a device or dtype is asked for, so
the operator validates a server's settings without loading torch."""
DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
}
DEFAULT_CPU_KV_CACHE_GB = 4.0


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine is built from. ``num_kv_blocks`` wins over the KV
    memory budget (``kv_cache_memory_gb``; on CUDA, ``gpu_memory_utilization``; on a
    CPU by default, ``max_num_seqs`` full contexts, at most DEFAULT_CPU_KV_CACHE_GB).
    ``enforce_eager`` turns off the CUDA graphs that replay decode steps. ``kv_events_config``
    (vLLM's ``--kv-events-config``) publishes the prefix cache's changes; None: off."""

    model: str
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_gb: float | None = None
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    attention_backend: str = "auto"
    tensor_parallel_size: int = 1
    seed: int = 0
    kv_events_config: KVEventsConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size > 1 is not supported yet; use 1")
        positive = ["max_num_seqs", "max_num_batched_tokens", "block_size"]
        positive += [n for n in ("max_model_len", "num_kv_blocks") if getattr(self, n) is not None]
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )

    def torch_device(self) -> "torch.device":
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, checkpoint_dtype: str | None, device: "torch.device") -> "torch.dtype":
        """``auto`` takes the checkpoint's dtype, except float16 on a CPU (too slow
        there) which becomes bfloat16."""
        name = self.dtype
        if name == "auto":
            name = checkpoint_dtype if checkpoint_dtype in DTYPES else "float32"
            if name == "float16" and device.type == "cpu":
                name = "bfloat16"
        import torch

        return getattr(torch, name)
