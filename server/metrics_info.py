"""Metrics set once, when the engine is built: vLLM's ``cache_config_info`` and our startup
phases."""

from prometheus_client import CollectorRegistry, Gauge

from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.startup import StartupPhases


def cache_config_labels(engine: LLMEngine) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` that kvserve can fill truthfully, each spelt
    as vLLM spells it (``str()`` of a CacheConfig field, ``engine`` its index).

    The KV cache lives on the engine's device: ``num_gpu_blocks`` counts its blocks (on a
    CPU too, as vLLM's CPU backend does) and there is no second, CPU tier
    (``num_cpu_blocks`` None). ``cache_dtype`` is ``--kv-cache-dtype`` as given (``auto``:
    the model's dtype; ``fp8`` or ``fp8_e4m3``: e4m3), as vLLM's label spells it.
    ``num_gpu_blocks_override`` is ``--num-kv-blocks`` and ``kv_cache_memory_bytes`` is
    ``--kv-cache-memory-gb`` in bytes; ``gpu_memory_utilization`` applies on CUDA only.
    ``kv_cache_size_tokens`` is the tokens the blocks hold and ``kv_cache_max_concurrency``
    the requests at the full context they hold at once (blocks over blocks per request).
    ``prefix_caching_hash_algo`` is ``--prefix-caching-hash-algo`` (``sha256``, one of
    vLLM's). ``kv_cache_max_concurrency`` counts every KV group's blocks (a sliding-window
    group's: its window's). Left out, having no kvserve counterpart: ``sliding_window`` (one
    label for what is a window per layer here: the plan line lists the groups), swap space,
    offloading and the Mamba settings.
    """
    config = engine.config
    memory = config.kv_cache_memory_gb
    num_blocks = engine.kv.pool.num_blocks
    return {
        "block_size": str(config.block_size),
        "cache_dtype": config.kv_cache_dtype,
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "is_attention_free": "False",
        "prefix_caching_hash_algo": config.prefix_caching_hash_algo,
        "kv_cache_memory_bytes": "None" if memory is None else str(int(memory * 2**30)),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(num_blocks),
        "num_gpu_blocks_override": str(config.num_kv_blocks),
        "kv_cache_size_tokens": str(num_blocks * config.block_size),
        "kv_cache_max_concurrency": str(num_blocks / engine.kv.blocks_needed(engine.max_model_len)),
        "engine": "0",
    }


def register_engine_info(
    registry: CollectorRegistry,
    model_name: str,
    cache_config: dict[str, str],
    startup: StartupPhases,
) -> None:
    info = Gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        list(cache_config),
        registry=registry,
    )
    info.labels(**cache_config).set(1)
    phases = Gauge(
        "kvserve:startup_phase_seconds",
        "Seconds each startup phase took (kvserve/engine/startup.py): download (always 0, "
        "the server never downloads), load, kv_alloc, warmup.",
        ["model_name", "phase"],
        registry=registry,
    )
    for phase, seconds in startup.items():
        phases.labels(model_name, phase).set(seconds)
