"""The attention kinds mean what they mean in ``transformers``: its eager attention of each
family (gpt-oss's sinks, Gemma's soft-cap and scale, Mistral's window) under its own
sliding-window mask function, with the config's ``sliding_window`` passed unchanged, gives
the torch backend's output over the paged cache."""

import importlib
import math
from types import SimpleNamespace

import pytest
import torch
from attention_kinds_reference import make_kind_batch
from transformers.masking_utils import sliding_window_causal_mask_function

from kvserve.engine.layers.attention.torch_backend import TorchAttention

WINDOW = 13
FAMILIES = [  # family, sinks, softcap, scale
    pytest.param("gpt_oss", True, None, 64**-0.5, id="gpt_oss"),
    pytest.param("gemma2", False, 2.0, 0.3, id="gemma2"),
    pytest.param("gemma3", False, None, 0.3, id="gemma3"),
    pytest.param("mistral", False, None, 64**-0.5, id="mistral"),
]


@pytest.mark.parametrize("family, with_sinks, softcap, scale", FAMILIES)
def test_a_windowed_chunk_matches_transformers_eager_attention(family, with_sinks, softcap, scale):
    torch.manual_seed(0)
    q_len, seq_len, heads, kv_heads = 9, 39, 4, 2
    batch = make_kind_batch(
        [q_len],
        [seq_len],
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=64,
        dtype=torch.float32,
        block_size=8,
        window=WINDOW,
    )
    sinks = torch.randn(heads) * 2 if with_sinks else None
    ours = TorchAttention().attend(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        batch.meta,
        scale,
        window=WINDOW,
        sinks=sinks,
        softcap=softcap,
    )

    q_positions = torch.arange(seq_len - q_len, seq_len)[:, None]
    allowed = sliding_window_causal_mask_function(WINDOW)(
        0, 0, q_positions, torch.arange(seq_len)[None, :]
    )
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, -math.inf)[None, None]
    eager = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    module = SimpleNamespace(
        num_key_value_groups=heads // kv_heads, sinks=sinks, training=False, head_dim=64
    )
    kwargs = {"softcap": softcap} if family.startswith("gemma") else {}
    theirs, _ = eager.eager_attention_forward(
        module,
        batch.query.transpose(0, 1)[None],
        batch.keys[0].transpose(0, 1)[None],
        batch.values[0].transpose(0, 1)[None],
        mask,
        scaling=scale,
        **kwargs,
    )
    torch.testing.assert_close(ours, theirs[0], rtol=1e-5, atol=1e-5)
