"""The Gated DeltaNet layer against transformers' own (Qwen3-Next's and Qwen3.5's, both
projection layouts), with the same random weights, float32, every token position compared:
a ragged batch of two prompts in one pass, a prompt in two chunks (the second from the
state the first left in its slot), and a prefill then decode steps; the torch path and the
Triton kernels (on the GPU or in Triton's interpreter). transformers' layer runs each whole
prompt in one pass, without a cache. Worst error measured 5e-7 (outputs up to 0.8);
bound 1e-4. A two-rank split (each rank's heads, the row-parallel sum done by hand) must
give the one-rank output.
"""

from dataclasses import dataclass

import pytest
import torch
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

from kvserve.engine.layers.linear import default_weight_loader
from kvserve.engine.layers.linear_attention.config import GatedDeltaNetConfig
from kvserve.engine.layers.linear_attention.gated_delta_net import GatedDeltaNet
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.layers.tensor_parallel import TensorParallel

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ATOL = 1e-4
SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}
HF = {
    "qwen3_next": (Qwen3NextConfig, Qwen3NextGatedDeltaNet),
    "qwen3_5": (Qwen3_5TextConfig, Qwen3_5GatedDeltaNet),
}


def hf_layer(layout: str) -> tuple[torch.nn.Module, GatedDeltaNetConfig]:
    config_class, layer_class = HF[layout]
    config = config_class(**SHAPE)
    torch.manual_seed(0)
    layer = layer_class(config, layer_idx=0).float().eval()
    with torch.no_grad():
        layer.dt_bias.normal_()
        layer.norm.weight.uniform_(0.5, 1.5)
        layer.conv1d.weight.normal_(0, 0.5)
    return layer, GatedDeltaNetConfig.from_hf(config, layout)


def ours_from(
    hf: torch.nn.Module, cfg: GatedDeltaNetConfig, kernels: str, tp=None
) -> GatedDeltaNet:
    layer = GatedDeltaNet(cfg, tp or TensorParallel(), kernels=kernels)
    params = dict(layer.named_parameters())
    for name, tensor in hf.state_dict().items():
        module, _, leaf = name.rpartition(".")
        target, shard_id = layer.checkpoint_parts.get(module, (module, None))
        param = params[f"{target}.{leaf}" if target else leaf]
        getattr(param, "weight_loader", default_weight_loader)(param, tensor, shard_id)
    return layer.to(DEVICE)


@dataclass
class Step:
    """One step: rows per sequence, their slots, whether each has a prior state."""

    lens: list[int]
    slots: list[int]
    has_state: list[bool]

    def metadata(self) -> StateMetadata:
        starts = [0]
        for n in self.lens:
            starts.append(starts[-1] + n)
        return StateMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
            state_slots=torch.tensor(self.slots, dtype=torch.int32, device=DEVICE),
            has_initial_state=torch.tensor(self.has_state, device=DEVICE),
            query_start_loc_host=starts,
        )


def run(layer: GatedDeltaNet, steps: list[tuple[torch.Tensor, Step]]) -> list[torch.Tensor]:
    cache = tuple(
        t.fill_(float("nan")) for t in layer.state_spec(torch.float32).allocate(3, DEVICE)
    )
    with torch.no_grad():
        return [layer(x.to(DEVICE), cache, step.metadata()).cpu() for x, step in steps]


def reference(hf: torch.nn.Module, prompt: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(prompt[None])[0]


LAYOUTS = ["qwen3_next", "qwen3_5"]
KERNELS = ["torch", "triton"]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_ragged_batch_in_one_pass_matches_transformers(layout, kernels):
    hf, cfg = hf_layer(layout)
    a, b = torch.randn(70, cfg.hidden_size), torch.randn(5, cfg.hidden_size)
    (out,) = run(
        ours_from(hf, cfg, kernels), [(torch.cat([a, b]), Step([70, 5], [2, 0], [False, False]))]
    )
    torch.testing.assert_close(out[:70], reference(hf, a), atol=ATOL, rtol=0)
    torch.testing.assert_close(out[70:], reference(hf, b), atol=ATOL, rtol=0)


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_chunks_then_decode_steps_match_one_pass(layout, kernels):
    hf, cfg = hf_layer(layout)
    prompt = torch.randn(24, cfg.hidden_size)
    steps = [
        (prompt[:9], Step([9], [1], [False])),
        (prompt[9:21], Step([12], [1], [True])),
        *((prompt[t : t + 1], Step([1], [1], [True])) for t in range(21, 24)),
    ]
    out = torch.cat(run(ours_from(hf, cfg, kernels), steps))
    torch.testing.assert_close(out, reference(hf, prompt), atol=ATOL, rtol=0)


class HandSummed(TensorParallel):
    """A rank of a group whose all-reduce the test does by hand (no process group)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_ranks_sum_to_one(layout):
    hf, cfg = hf_layer(layout)
    prompt = torch.randn(6, cfg.hidden_size)
    steps = [(prompt[:5], Step([5], [0], [False])), (prompt[5:], Step([1], [0], [True]))]
    ranks = [ours_from(hf, cfg, "torch", HandSummed(r, 2, group=object())) for r in range(2)]
    summed = torch.cat(
        [a + b for a, b in zip(*(run(layer, steps) for layer in ranks), strict=True)]
    )
    torch.testing.assert_close(summed, reference(hf, prompt), atol=ATOL, rtol=0)
