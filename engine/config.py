"""Engine settings, validated once with messages that name the setting."""

from dataclasses import dataclass

from kvserve.engine.core.block_hash import HASH_ALGOS
from kvserve.engine.kv_events import KVEventsConfig
from kvserve.engine.settings import Crd, check_minimums, setting
from kvserve.engine.spec_decode.config import SpeculativeConfig

DTYPES = ("float32", "bfloat16", "float16")
"""torch dtype names: this module never imports torch, so the operator validates a server's
settings without loading it (``execution_plan`` resolves the device and the dtype)."""
DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
}
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
QUANTIZATIONS = ("fp8",)
"""vLLM's ``--quantization`` values that quantize a 16-bit checkpoint as it loads; a checkpoint
that is already quantized names its own method in ``quantization_config``."""
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
"""vLLM's ``--kv-cache-dtype``: ``auto`` stores keys and values in the model's dtype, ``fp8``
(= ``fp8_e4m3``) as e4m3 with a per-tensor scale per layer."""
EXECUTOR_BACKENDS = ("mp", "uni")
"""vLLM's ``--distributed-executor-backend``: ``mp`` runs ranks 1..N-1 in worker processes
(``engine/executor/multiproc.py``), ``uni`` runs the one rank in the engine's process."""


BATCH_DEFAULTS = {"cpu": (64, 2048), "cuda": (256, 8192)}
"""``(max_num_seqs, max_num_batched_tokens)`` of a config that sets neither, by device type
(on CUDA vLLM's on an H100)."""


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine is built from. ``num_kv_blocks`` wins over the KV
    memory budget (``kv_cache_memory_gb``; on CUDA, ``gpu_memory_utilization``; on a
    CPU by default, ``max_num_seqs`` full contexts, at most
    ``kv_cache_sizing.DEFAULT_CPU_KV_CACHE_GB``).
    ``enforce_eager`` turns off the replayed steps (CUDA graphs of decode steps and of mixed
    steps up to ``max_cudagraph_capture_size`` tokens; on a CPU, recorded kernel calls of
    decode steps). ``kv_events_config`` (vLLM's ``--kv-events-config``) publishes the prefix
    cache's changes; None: off.
    Each field is declared once with ``setting`` (``engine/settings.py``): its ``serve`` flag,
    ``KVSERVE_*`` variable, choices, minimum and, with a ``Crd``, its LLMDeployment field."""

    model: str = setting(
        help="checkpoint directory or GGUF file (default: SmolLM2-135M-Instruct once fetched, "
        "else the embedded demo model)"
    )
    tokenizer: str | None = setting(
        None, help="tokenizer directory or GGUF file (default: the model's own)"
    )
    dtype: str = setting("auto", choices=("auto", *DTYPES), crd=Crd(defaulted=True))
    device: str = setting("auto", choices=DEVICES)
    max_num_seqs: int | None = setting(
        None,
        minimum=1,
        crd=Crd(),
        help="the most sequences a step runs (default: 64 on a CPU, 256 on CUDA)",
    )
    max_num_batched_tokens: int | None = setting(
        None,
        minimum=1,
        crd=Crd(),
        help="the most tokens a step computes (default: 2048 on a CPU, 8192 on CUDA)",
    )
    max_model_len: int | None = setting(None, minimum=1, crd=Crd())
    long_prefill_token_threshold: int = setting(
        0,
        minimum=0,
        crd=Crd(),
        help="the most prompt tokens one request computes in a step (0: no cap below "
        "max_num_batched_tokens); a long prompt then shares its steps with the running "
        "streams' decodes",
    )
    block_size: int = setting(16, minimum=1, crd=Crd(schema={"enum": [8, 16, 32, 64, 128]}))
    num_kv_blocks: int | None = setting(None, minimum=1, help="exact number of KV blocks")
    kv_cache_memory_gb: float | None = setting(None, help="KV-cache budget in GiB")
    gpu_memory_utilization: float = setting(0.9, crd=Crd(schema={"minimum": 0.05, "maximum": 1}))
    enforce_eager: bool = setting(
        False,
        help="no replayed steps (CUDA graphs of decode and mixed steps, recorded CPU kernel "
        "calls of decode steps)",
    )
    max_cudagraph_capture_size: int = setting(
        512,
        minimum=0,
        help="the most tokens of a step with prefill chunks that replays a CUDA graph "
        "(capped at max_num_batched_tokens; 0: such steps run eagerly, decode steps alone "
        "replay graphs)",
    )
    tensor_parallel_size: int = setting(
        1,
        minimum=1,
        crd=Crd(defaulted=True),
        help="ranks the model's layers are sharded over: rank 0 in the engine's process, the "
        "others in worker processes (on CUDA one device each; on a CPU cores // size threads "
        "each)",
    )
    distributed_executor_backend: str | None = setting(
        None,
        choices=EXECUTOR_BACKENDS,
        crd=Crd(),
        help="mp: ranks 1..N-1 in worker processes; uni: one rank in the engine's process, "
        "tensor_parallel_size 1 only (default: uni for one rank, mp for several)",
    )
    pipeline_parallel_size: int = setting(
        1,
        minimum=1,
        help="stages the model's layers are split in, contiguous (the embedding on the first, "
        "the final norm and LM head on the last); world size = tensor_parallel_size x "
        "pipeline_parallel_size ranks, rank r in stage r // tensor_parallel_size",
    )
    nnodes: int = setting(
        1,
        minimum=1,
        help="nodes the ranks are spread over, world size / nnodes ranks on each (node n "
        "holds ranks n*local .. n*local+local-1)",
    )
    node_rank: int = setting(
        0, minimum=0, help="this node's index among nnodes; node 0 is the leader"
    )
    master_addr: str = setting(
        "127.0.0.1",
        help="the leader's address, where every node meets the rendezvous (nnodes > 1)",
    )
    master_port: int = setting(29501, minimum=1, help="the leader's rendezvous port (nnodes > 1)")
    headless: bool = setting(
        False,
        help="run this node's ranks only, no API server and no engine core (a worker node: "
        "node_rank >= 1)",
    )
    distributed_timeout_seconds: float = setting(
        600.0,
        help="how long the nodes wait for each other at the rendezvous before the one that "
        "never arrived is named in an error",
    )
    quantization: str | None = setting(
        None,
        choices=QUANTIZATIONS,
        crd=Crd(),
        help="quantize a 16-bit checkpoint's linear layers as it loads (fp8: per-channel "
        "e4m3 weights, dynamic per-token activation scales); a quantized checkpoint's own "
        "method comes from its quantization_config",
    )
    kv_cache_dtype: str = setting(
        "auto",
        choices=KV_CACHE_DTYPES,
        crd=Crd(),
        help="the KV cache's element type: auto (the model's dtype) or fp8 (e4m3, half the "
        "memory of 16 bits; per-layer k/v scales from the checkpoint, else 1.0)",
    )
    enable_prefix_caching: bool = setting(True, crd=Crd(defaulted=True))
    prefix_caching_hash_algo: str = setting(
        "sha256",
        choices=tuple(HASH_ALGOS),
        help="the prefix cache's block key: a content hash, the same in every process and "
        "in the KV events (sha256: SHA-256 of the parent key and the block's token ids)",
    )
    attention_backend: str = setting("auto", choices=ATTENTION_BACKENDS)
    seed: int | None = setting(
        None,
        help="seed of the requests that give none: the k-th request the engine takes samples "
        "from a generator seeded with (seed, k), so the same requests in the same order get "
        "the same tokens however they are batched (default: unseeded)",
    )
    kv_events_config: KVEventsConfig | None = setting(
        None,
        parse=KVEventsConfig.from_json,
        metavar="JSON",
        help="publish KV-cache events over ZMQ, vLLM's JSON keys, e.g. "
        '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv@POD@MODEL"}\'',
    )
    speculative_config: SpeculativeConfig | None = setting(
        None,
        parse=SpeculativeConfig.from_json,
        metavar="JSON",
        help="speculative decoding, vLLM's JSON keys, e.g. "
        '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\' '
        "(default: off)",
    )

    async_scheduling: bool = setting(
        False,
        crd=Crd(),
        help="schedule and prepare step N+1 while step N runs: step N's sampled tokens feed "
        "step N+1 on the device; their copy to the host, detokenization, stop checks and "
        "streaming happen while the next step runs (a request that ends in step N costs one "
        "thrown-away token of step N+1)",
    )

    enable_lora: bool = setting(False, help="serve LoRA adapters (PEFT directories)")
    max_loras: int = setting(
        1, minimum=1, help="LoRA adapters resident on the device at once", crd=Crd()
    )
    max_lora_rank: int = setting(
        16, minimum=1, help="the highest LoRA rank an adapter may have", crd=Crd()
    )
    max_cpu_loras: int | None = setting(
        None,
        minimum=1,
        crd=Crd(),
        help="LoRA adapters kept in host memory, least recently used dropped and read again "
        "when asked for (default: max_loras; at least max_loras)",
    )

    def batch_limits(self, device_type: str) -> tuple[int, int]:
        """``(max_num_seqs, max_num_batched_tokens)`` on a device of ``device_type``: each the
        setting, or where it is unset the device's (``BATCH_DEFAULTS``; a type other than
        ``cuda``, e.g. ``meta``, as a CPU)."""
        seqs, tokens = BATCH_DEFAULTS["cuda" if device_type == "cuda" else "cpu"]
        return (
            seqs if self.max_num_seqs is None else self.max_num_seqs,
            tokens if self.max_num_batched_tokens is None else self.max_num_batched_tokens,
        )

    def __post_init__(self) -> None:
        if isinstance(self.speculative_config, dict):
            spec = SpeculativeConfig.from_dict(self.speculative_config)
            object.__setattr__(self, "speculative_config", spec)
        spec = self.speculative_config
        if spec is not None and spec.method == "draft_model":
            for name in ("tensor_parallel_size", "pipeline_parallel_size"):
                if getattr(self, name) != 1:
                    raise ValueError(
                        f"speculative_config.method draft_model runs with {name} 1, not "
                        f"{getattr(self, name)}"
                    )
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ValueError(
                f"prefix_caching_hash_algo must be one of {sorted(HASH_ALGOS)}, "
                f"got {self.prefix_caching_hash_algo!r}"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {list(QUANTIZATIONS)}, got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        check_minimums(self)
        self._check_layout()
        backend = self.distributed_executor_backend
        if backend is None:
            backend = "uni" if self.world_size == 1 else "mp"
            object.__setattr__(self, "distributed_executor_backend", backend)
        if backend not in EXECUTOR_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {list(EXECUTOR_BACKENDS)}, "
                f"got {backend!r}"
            )
        if backend == "uni" and self.world_size != 1:
            raise ValueError(
                f"distributed_executor_backend uni runs one rank, not tensor_parallel_size "
                f"{self.tensor_parallel_size}"
                + (
                    f" x pipeline_parallel_size {self.pipeline_parallel_size}"
                    if self.pipeline_parallel_size > 1
                    else ""
                )
                + "; use mp"
            )
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        if self.kv_cache_memory_gb is not None and self.kv_cache_memory_gb <= 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )

    @property
    def world_size(self) -> int:
        """Every rank of every node: tensor_parallel_size x pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def local_world_size(self) -> int:
        """The ranks each node runs."""
        return self.world_size // self.nnodes

    def _check_layout(self) -> None:
        """The ranks spread evenly over the nodes, this node one of them, a headless one a
        worker node."""
        if self.world_size % self.nnodes:
            raise ValueError(
                f"nnodes {self.nnodes} must divide the world size tensor_parallel_size "
                f"{self.tensor_parallel_size} x pipeline_parallel_size "
                f"{self.pipeline_parallel_size} = {self.world_size}"
            )
        if self.node_rank >= self.nnodes:
            raise ValueError(
                f"node_rank {self.node_rank} is out of range for nnodes {self.nnodes} "
                f"(0..{self.nnodes - 1})"
            )
        if self.headless and self.node_rank == 0:
            raise ValueError(
                "headless runs a worker node's ranks; node_rank 0 is the leader, which runs "
                "the API server and the engine: give headless a node_rank from 1 to nnodes - 1"
            )
        if self.node_rank > 0 and not self.headless:
            raise ValueError(
                f"node_rank {self.node_rank} is a worker node: run it with headless (only "
                "node_rank 0 runs the API server and the engine)"
            )
        if self.pipeline_parallel_size > 1 and self.enable_lora:
            raise ValueError("enable_lora is not supported with pipeline_parallel_size > 1")
        if self.distributed_timeout_seconds <= 0:
            raise ValueError(
                f"distributed_timeout_seconds must be > 0, got {self.distributed_timeout_seconds}"
            )
