"""The attention layer's kind: its sinks parameter, sharded by query heads, and what it hands
the backend each step."""

import pytest
import torch

from kvserve.engine.layers.attention.layer import Attention
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.attention.torch_backend import TorchAttention
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.models.model_config import RopeConfig

HEAD_DIM = 16


class RecordingAttention(TorchAttention):
    """The torch backend, keeping the arguments of its last ``attend``."""

    def attend(self, query, key_cache, value_cache, meta, scale, kv_scales, **kind):
        self.called = dict(scale=scale, **kind)
        return super().attend(query, key_cache, value_cache, meta, scale, kv_scales, **kind)


def layer(tp: TensorParallel = TensorParallel(), **kind) -> Attention:
    return Attention(
        64,
        8,
        2,
        HEAD_DIM,
        qkv_bias=False,
        o_bias=False,
        qk_norm_eps=None,
        rotary=RotaryEmbedding(RopeConfig(), HEAD_DIM, 32),
        backend=RecordingAttention(),
        tp=tp,
        **kind,
    )


def step(attention: Attention) -> dict:
    """One 3-token prompt through ``attention``; what its backend was called with."""
    attention.rotary.build(torch.float32, torch.device("cpu"))
    cache = torch.zeros(2, 4, attention.num_kv_heads, HEAD_DIM)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(3),
        query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
        seq_lens=torch.tensor([3], dtype=torch.int32),
        block_tables=torch.tensor([[0, 1]], dtype=torch.int32),
        query_lens_host=[3],
        seq_lens_host=[3],
        max_query_len=3,
        max_seq_len=3,
    )
    with torch.no_grad():
        attention(torch.arange(3), torch.randn(3, 64), (cache, cache.clone()), meta)
    return attention.backend.called  # type: ignore[union-attr]


def test_a_plain_layer_scales_by_head_dim_and_passes_no_kind():
    called = step(layer())
    assert called == dict(scale=HEAD_DIM**-0.5, window=None, sinks=None, softcap=None)
    assert "sinks" not in dict(layer().named_parameters())


def test_the_layer_passes_its_window_sinks_softcap_and_scale():
    attention = layer(sliding_window=128, sinks=True, softcap=50.0, scale=0.25)
    called = step(attention)
    assert called["sinks"] is attention.sinks
    assert {k: v for k, v in called.items() if k != "sinks"} == dict(
        scale=0.25, window=128, softcap=50.0
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_loads_the_sinks_of_its_query_heads_in_float32(rank):
    attention = layer(TensorParallel(rank, 2, group=object()), sinks=True)
    checkpoint = torch.arange(8, dtype=torch.bfloat16) - 3.5
    params = dict(attention.named_parameters())
    params["sinks"].weight_loader(params["sinks"], checkpoint)  # type: ignore[attr-defined]
    assert attention.sinks is params["sinks"] and attention.sinks.dtype == torch.float32
    assert attention.sinks.tolist() == (checkpoint[4 * rank : 4 * rank + 4]).float().tolist()


@pytest.mark.parametrize(
    "kind, message",
    [
        (dict(sliding_window=0), "sliding window must be at least 1"),
        (dict(softcap=0.0), "soft-cap must be positive"),
    ],
)
def test_a_layer_refuses_an_empty_window_or_a_cap_of_zero(kind, message):
    with pytest.raises(ValueError, match=message):
        layer(**kind)
