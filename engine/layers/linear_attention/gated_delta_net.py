"""The Gated DeltaNet layer of Qwen3-Next and Qwen3.5 over this rank's heads.

    qkv, z, b, a = input projections (column-parallel, by key head)
    q, k, v = silu(causal depthwise conv1d(qkv))          conv state per sequence
    beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
    o = gated delta rule(q, k, v, g, beta)                 recurrent state per sequence
    out = out_proj(gated_rms_norm(o, z))                   row-parallel: one all-reduce

Both states live in slots (``metadata.StateMetadata``); a step whose sequences all have one
token runs the recurrent step kernels, any other the chunked prefill ones (sequences of one
token among longer ones included). ``kernels`` as the execution plan names them
(``linear.KERNELS``): ``triton`` runs the Triton kernels (the GPU, or their interpreter on a
CPU), any other the torch path.
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.engine.kernels import delta_rule_torch, triton_delta_rule
from kvserve.engine.layers.linear import (
    LinearMethod,
    RowParallelLinear,
    divide,
    read,
    set_weight_loader,
)
from kvserve.engine.layers.linear_attention.config import GatedDeltaNetConfig
from kvserve.engine.layers.linear_attention.gated_rms_norm import GatedRMSNorm
from kvserve.engine.layers.linear_attention.metadata import (
    LinearAttentionCache,
    StateMetadata,
    StateSpec,
)
from kvserve.engine.layers.linear_attention.projections import (
    Qwen3_5Projections,
    Qwen3NextProjections,
)
from kvserve.engine.layers.linear_attention.short_conv import ShortConvolution
from kvserve.engine.layers.tensor_parallel import TensorParallel


class GatedDeltaNet(nn.Module):
    """Parameters (this rank's part): the input projections, ``conv1d.weight``
    (``ShortConvolution``), ``A_log`` and ``dt_bias`` ``[v_heads / tp]`` float32,
    ``norm.weight`` ``[head_v_dim]`` (whole), ``out_proj``."""

    def __init__(
        self,
        cfg: GatedDeltaNetConfig,
        tp: TensorParallel,
        method: LinearMethod | None = None,
        kernels: str = "torch",
    ) -> None:
        super().__init__()
        self.cfg, self.tp, self.kernels = cfg, tp, kernels
        self.num_k_heads = divide(cfg.num_k_heads, tp.size, "linear-attention key heads")
        self.num_v_heads = self.num_k_heads * cfg.group
        self.key_dim = self.num_k_heads * cfg.head_k_dim
        self.value_dim = self.num_v_heads * cfg.head_v_dim
        projections = Qwen3NextProjections if cfg.layout == "qwen3_next" else Qwen3_5Projections
        self.projections = projections(cfg, tp, method)
        key_dim = cfg.num_k_heads * cfg.head_k_dim
        sections = [key_dim, key_dim, cfg.num_v_heads * cfg.head_v_dim]
        self.conv1d = ShortConvolution(sections, cfg.conv_kernel, tp, kernels)
        self.A_log = self._head_parameter()
        self.dt_bias = self._head_parameter()
        self.norm = GatedRMSNorm(cfg.head_v_dim, cfg.eps)
        self.out_proj = RowParallelLinear(
            cfg.num_v_heads * cfg.head_v_dim, cfg.hidden_size, False, tp, method
        )
        self.checkpoint_parts = {
            name: (f"projections.{ours}", shard_id)
            for name, (ours, shard_id) in self.projections.checkpoint_parts.items()
        }
        """Checkpoint module names under the layer stored under another here → (our module,
        shard id); the other tensors (``conv1d.weight``, ``A_log``, ``dt_bias``,
        ``norm.weight``, ``out_proj.*``) keep their names."""

    def state_spec(self, dtype: torch.dtype) -> StateSpec:
        """The per-sequence state of this rank for a model in ``dtype``."""
        return self.cfg.state_spec(self.tp.size, dtype)

    def forward(
        self, hidden: torch.Tensor, cache: LinearAttentionCache, meta: StateMetadata
    ) -> torch.Tensor:
        conv_state, ssm_state = cache
        qkv, z, b, a = self.projections(hidden)
        qkv = self.conv1d(qkv, conv_state, meta)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.unflatten(-1, (self.num_k_heads, self.cfg.head_k_dim))
        k = k.unflatten(-1, (self.num_k_heads, self.cfg.head_k_dim))
        v = v.unflatten(-1, (self.num_v_heads, self.cfg.head_v_dim))
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        o = self._delta_rule(q, k, v, g, beta, ssm_state, meta)
        return self.out_proj(self.norm(o, z).flatten(1))

    def _delta_rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        meta: StateMetadata,
    ) -> torch.Tensor:
        slots, has_state = meta.state_slots, meta.has_initial_state
        if self.kernels == "triton":
            if meta.decode_only:
                return triton_delta_rule.delta_rule_step(q, k, v, g, beta, state, slots, has_state)
            cu = meta.query_start_loc
            return triton_delta_rule.chunked_delta_rule(
                q, k, v, g, beta, cu, state, slots, has_state
            )
        if meta.decode_only:
            return delta_rule_torch.gated_delta_rule_step(q, k, v, g, beta, state, slots, has_state)
        cu_host = meta.query_start_loc_host
        return delta_rule_torch.gated_delta_rule_chunked(
            q, k, v, g, beta, cu_host, state, slots, has_state
        )

    def _head_parameter(self) -> nn.Parameter:
        """``[v_heads / tp]`` float32 (``A_log``, ``dt_bias``), loaded by ``_load_heads``."""
        param = nn.Parameter(
            torch.empty(self.num_v_heads, dtype=torch.float32), requires_grad=False
        )
        set_weight_loader(param, self._load_heads)
        return param

    def _load_heads(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        """``A_log``, ``dt_bias``: this rank's value heads."""
        with torch.no_grad():
            param.copy_(read(loaded, 0, self.tp.rank * self.num_v_heads, self.num_v_heads))
