"""The ``serve`` flags and their ``KVSERVE_*`` environment: flag beats environment beats default."""

import dataclasses

import pytest

from kvserve.engine.kv_events import KVEventsConfig
from kvserve.server.cli import build_parser, engine_config


def test_cli_flag_beats_environment_beats_default(monkeypatch):
    monkeypatch.setenv("KVSERVE_PORT", "9001")
    monkeypatch.setenv("KVSERVE_API_KEY", "from-env")
    monkeypatch.setenv("KVSERVE_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("KVSERVE_KV_CACHE_MEMORY_GB", "1.5")
    args = build_parser().parse_args(["serve", "--api-key", "from-flag"])
    assert (args.port, args.api_key, args.enable_prefix_caching) == (9001, "from-flag", False)
    assert args.kv_cache_memory_gb == 1.5
    assert build_parser().parse_args(["serve", "--enable-prefix-caching"]).enable_prefix_caching
    monkeypatch.delenv("KVSERVE_PORT")
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.port, defaults.host, defaults.shutdown_timeout) == (8000, "0.0.0.0", 30.0)
    assert (defaults.model, defaults.max_waiting_requests) == (None, None)


def test_bad_environment_values_stop_the_cli(monkeypatch):
    monkeypatch.setenv("KVSERVE_DTYPE", "float8")
    with pytest.raises(SystemExit, match="KVSERVE_DTYPE must be one of auto, float32"):
        build_parser()


def test_seed_flag_and_environment_reach_the_engine(monkeypatch):
    assert engine_config(build_parser().parse_args(["serve"])).seed is None
    monkeypatch.setenv("KVSERVE_SEED", "3")
    assert engine_config(build_parser().parse_args(["serve"])).seed == 3
    assert engine_config(build_parser().parse_args(["serve", "--seed", "7"])).seed == 7


def test_every_engine_setting_is_a_flag_and_an_environment_variable(monkeypatch):
    """``EngineConfig``'s fields, each set through its ``KVSERVE_*`` variable, arrive as set."""
    values = {
        "KVSERVE_TOKENIZER": "/t",
        "KVSERVE_DTYPE": "bfloat16",
        "KVSERVE_DEVICE": "cpu",
        "KVSERVE_MAX_NUM_SEQS": "3",
        "KVSERVE_MAX_NUM_BATCHED_TOKENS": "99",
        "KVSERVE_MAX_MODEL_LEN": "77",
        "KVSERVE_LONG_PREFILL_TOKEN_THRESHOLD": "12",
        "KVSERVE_BLOCK_SIZE": "8",
        "KVSERVE_NUM_KV_BLOCKS": "5",
        "KVSERVE_KV_CACHE_MEMORY_GB": "0.5",
        "KVSERVE_GPU_MEMORY_UTILIZATION": "0.5",
        "KVSERVE_ENFORCE_EAGER": "true",
        "KVSERVE_MAX_CUDAGRAPH_CAPTURE_SIZE": "64",
        "KVSERVE_TENSOR_PARALLEL_SIZE": "1",
        "KVSERVE_PIPELINE_PARALLEL_SIZE": "1",
        "KVSERVE_NNODES": "1",
        "KVSERVE_NODE_RANK": "0",
        "KVSERVE_MASTER_ADDR": "10.0.0.1",
        "KVSERVE_MASTER_PORT": "1234",
        "KVSERVE_HEADLESS": "false",
        "KVSERVE_DISTRIBUTED_TIMEOUT_SECONDS": "30",
        "KVSERVE_QUANTIZATION": "fp8",
        "KVSERVE_KV_CACHE_DTYPE": "fp8",
        "KVSERVE_ENABLE_PREFIX_CACHING": "false",
        "KVSERVE_PREFIX_CACHING_HASH_ALGO": "sha256",
        "KVSERVE_ATTENTION_BACKEND": "torch",
        "KVSERVE_SEED": "11",
        "KVSERVE_KV_EVENTS_CONFIG": '{"enable_kv_cache_events": true}',
        "KVSERVE_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 3}',
        "KVSERVE_ASYNC_SCHEDULING": "true",
        "KVSERVE_ENABLE_LORA": "true",
        "KVSERVE_MAX_LORAS": "2",
        "KVSERVE_MAX_LORA_RANK": "64",
        "KVSERVE_MAX_CPU_LORAS": "3",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    config = engine_config(build_parser().parse_args(["serve", "--model", "/m"]))
    assert dataclasses.asdict(config) == {
        "model": "/m",
        "tokenizer": "/t",
        "dtype": "bfloat16",
        "device": "cpu",
        "max_num_seqs": 3,
        "max_num_batched_tokens": 99,
        "max_model_len": 77,
        "long_prefill_token_threshold": 12,
        "block_size": 8,
        "num_kv_blocks": 5,
        "kv_cache_memory_gb": 0.5,
        "gpu_memory_utilization": 0.5,
        "enforce_eager": True,
        "max_cudagraph_capture_size": 64,
        "tensor_parallel_size": 1,
        "distributed_executor_backend": "uni",
        "pipeline_parallel_size": 1,
        "nnodes": 1,
        "node_rank": 0,
        "master_addr": "10.0.0.1",
        "master_port": 1234,
        "headless": False,
        "distributed_timeout_seconds": 30.0,
        "quantization": "fp8",
        "kv_cache_dtype": "fp8",
        "enable_prefix_caching": False,
        "prefix_caching_hash_algo": "sha256",
        "attention_backend": "torch",
        "seed": 11,
        "kv_events_config": dataclasses.asdict(KVEventsConfig(enable_kv_cache_events=True)),
        "speculative_config": {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 5,
            "prompt_lookup_max": 5,
            "model": None,
        },
        "async_scheduling": True,
        "enable_lora": True,
        "max_loras": 2,
        "max_lora_rank": 64,
        "max_cpu_loras": 3,
    }
