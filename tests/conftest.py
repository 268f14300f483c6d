import os
import sys
from pathlib import Path

import pytest
import torch

# Triton reads TRITON_INTERPRET when it decorates a kernel (when the kernel module is first
# imported), and pytest imports every test module into one process: the switch must be on
# before collection for the Triton kernels to run on CPU tensors. With CUDA they compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import build_checkpoint

# Each family with the switches that make it differ: GQA ratios, qkv bias (Qwen2),
# q/k norm (Qwen3), llama3 RoPE scaling and tied embeddings (llama3 variant).
FAMILIES = {
    "llama": ("llama", {}),
    "llama3-tied": (
        "llama",
        dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "mistral": ("mistral", dict(num_key_value_heads=4, sliding_window=None)),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", dict(head_dim=32)),
}


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """``checkpoint(name)`` → the directory of the tiny checkpoint ``name`` (built once)."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            family, overrides = FAMILIES[name]
            built[name] = build_checkpoint(family, tmp_path_factory.mktemp(name), **overrides)
        return built[name]

    return get
