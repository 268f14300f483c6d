"""The decoder-only transformer the Llama, Mistral, Qwen2 and Qwen3 families share, built
from ``engine/layers`` for one rank of a tensor-parallel group; each family's file
(``llama.py``, ``qwen2.py``, ``qwen3.py``) says what its architecture switches on.

They differ only in switches: grouped-query attention, a bias on q/k/v (Qwen2) or on q/k/v
and o (Llama's ``attention_bias``), per-head RMSNorm on q and k (Qwen3), RoPE scaling and
tied embeddings. q/k/v and gate/up projections are fused into one matmul each. A
mixture-of-experts family (``moe_decoder.py``) puts its MoE block in place of a layer's MLP
(``build_mlp``).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kvserve.engine.cdiv import cdiv
from kvserve.engine.layers import fused_ops
from kvserve.engine.layers.attention.backend import AttentionBackend
from kvserve.engine.layers.attention.layer import Attention, KVCache
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.layernorm import RMSNorm
from kvserve.engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.layers.pipeline_parallel import PipelineParallel
from kvserve.engine.layers.rotary import RotaryEmbedding
from kvserve.engine.layers.tensor_parallel import TensorParallel
from kvserve.engine.layers.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from kvserve.engine.models.model_config import ModelConfig
from kvserve.engine.quantization.linear_methods import linear_method

__all__ = ["DecoderLM", "KVCache", "MissingLayer", "StepMetadata", "Switches", "build_attention"]

StepMetadata = AttentionMetadata | list[AttentionMetadata | StateMetadata]
"""A step's layout for the layers: one ``AttentionMetadata`` for every layer, or each
layer's (several KV groups; a linear-attention layer's ``StateMetadata``)."""


@dataclass(frozen=True)
class Switches:
    """What a family turns on in the shared decoder."""

    qkv_bias: bool
    o_bias: bool
    qk_norm: bool = False


# The most bytes of gate/up activation one CPU pass of the MLP makes (see MLP).
CPU_MLP_CHUNK_BYTES = 16 << 20


class MLP(nn.Module):
    """On a CPU a large batch goes through in row chunks whose gate/up activation stays
    under CPU_MLP_CHUNK_BYTES. glibc gives every block of 32 MiB or more a fresh mmap and
    unmaps it when freed, so a bigger activation faults in (and the kernel zeroes) every
    page of it again in every layer: a 2048-token float32 step of the 134M model (its
    gate/up output is exactly 32 MiB) ran ~10 % slower (benchmarks/cpu-levers.md). Chunks
    this size reuse the heap's blocks and are still large matmuls; they are equal, so that the
    linear kernels' threads get equal shares of each (1,336 rows: 668 + 668, not 1,024 + 312).
    A model with LoRA layers turns ``chunk_rows`` off: its row groups span the whole batch."""

    chunk_rows = True

    def __init__(
        self,
        cfg: ModelConfig,
        tp: TensorParallel,
        prefix: str,
        intermediate_size: tuple[int, str] | None = None,
        reduce_results: bool = True,
    ) -> None:
        """``prefix``: the checkpoint's name of this MLP (``model.layers.3.mlp``);
        ``intermediate_size``: (size, its config.json name) if not ``intermediate_size``'s;
        ``reduce_results``: see ``RowParallelLinear``."""
        super().__init__()
        inter, what = intermediate_size or (cfg.intermediate_size, "intermediate_size")
        quant = cfg.quantization
        gate_up = linear_method(quant, [f"{prefix}.gate_proj", f"{prefix}.up_proj"])
        self.gate_up_proj = MergedColumnParallelLinear(
            cfg.hidden_size, [inter, inter], False, tp, gate_up, what=what
        )
        down = linear_method(quant, [f"{prefix}.down_proj"])
        self.down_proj = RowParallelLinear(
            inter, cfg.hidden_size, False, tp, down, what=what, reduce_results=reduce_results
        )
        self.gate_up_width = self.gate_up_proj.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        most = max(1, CPU_MLP_CHUNK_BYTES // (self.gate_up_width * x.element_size()))
        if x.device.type != "cpu" or x.shape[0] <= most or not self.chunk_rows:
            return self._rows(x)
        chunks = cdiv(x.shape[0], most)
        return torch.cat([self._rows(part) for part in x.split(cdiv(x.shape[0], chunks))])

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(fused_ops.silu_and_mul(self.gate_up_proj(x)))


def build_attention(
    cfg: ModelConfig,
    switches: Switches,
    rotary: RotaryEmbedding,
    backend: AttentionBackend,
    tp: TensorParallel,
    prefix: str,
    **kind: Any,
) -> Attention:
    """The attention of layer ``prefix`` (``model.layers.3``): ``cfg``'s hidden size, heads,
    kv heads and head size, the biases and q/k norms ``switches`` turn on (the norms'
    epsilon ``rms_norm_eps``), and the q/k/v and o weight methods the checkpoint's
    quantization gives ``{prefix}.self_attn``; ``kind``: ``Attention``'s other keywords
    (window, sinks, soft-cap, scale, v norm, output gate), which may also override
    ``head_dim`` and ``num_kv_heads`` for this layer."""
    attn, quant = f"{prefix}.self_attn", cfg.quantization
    return Attention(
        cfg.hidden_size,
        cfg.num_heads,
        kind.pop("num_kv_heads", cfg.num_kv_heads),
        kind.pop("head_dim", cfg.head_dim),
        qkv_bias=switches.qkv_bias,
        o_bias=switches.o_bias,
        qk_norm_eps=cfg.rms_norm_eps if switches.qk_norm else None,
        rotary=rotary,
        backend=backend,
        tp=tp,
        qkv_method=linear_method(quant, [f"{attn}.{p}_proj" for p in "qkv"]),
        o_method=linear_method(quant, [f"{attn}.o_proj"]),
        **kind,
    )


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        switches: Switches,
        rotary: RotaryEmbedding,
        backend: AttentionBackend,
        tp: TensorParallel,
        prefix: str,
        mlp: nn.Module,
        attention_kind: Mapping[str, Any],
    ) -> None:
        """``prefix``: the checkpoint's name of this layer (``model.layers.3``); ``mlp``: its
        MLP (``DecoderLM.build_mlp``); ``attention_kind``: ``Attention``'s keywords that
        set this layer's apart (``DecoderLM.attention_kind``)."""
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = build_attention(
            cfg, switches, rotary, backend, tp, prefix, **attention_kind
        )
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = mlp

    def forward(
        self,
        positions,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream is ``residual + hidden`` (``residual`` None: ``hidden``
        alone); returns this layer's (hidden, residual), the stream being their sum again,
        for every row or for rows ``out_rows`` alone. ``residual`` is updated in place."""
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden)
        else:
            normed = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, normed, kv_cache, meta, out_rows)
        if out_rows is not None:
            residual = residual[out_rows]
        return self.mlp(self.post_attention_layernorm(hidden, residual)), residual


class MissingLayer(nn.Module):
    """A part another pipeline stage holds: no weights, never called."""


class DecoderLM(nn.Module):
    """Token ids of a flat batch → hidden states; ``logits`` maps chosen rows to the vocabulary.
    Built for rank ``tp.rank`` of ``tp`` (every rank computes the same hidden states and
    logits; each holds and multiplies its shard of the weights). ``keep_stage`` makes it one
    pipeline stage: ``stage`` its layers, the others ``MissingLayer``."""

    stage: range | None = None
    """The layers this model runs (None: all)."""

    layers_after_embed = True
    """``forward`` is ``embed`` then ``run_layers``, as a recorded CPU decode step runs them
    (``graphs/cpu_graphs.py``); a model whose layers take more than the embedding sets it
    False and decodes eagerly on a CPU."""

    @classmethod
    def switches(cls, cfg: ModelConfig) -> Switches:
        """Llama's: ``attention_bias`` puts a bias on q, k, v and o."""
        return Switches(qkv_bias=cfg.attention_bias, o_bias=cfg.attention_bias)

    def __init__(
        self,
        cfg: ModelConfig,
        backend: AttentionBackend,
        max_positions: int,
        tp: TensorParallel = TensorParallel(),
    ) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp
        switches = self.switches(cfg)
        self.rotary = RotaryEmbedding(cfg.rope, cfg.head_dim, max_positions)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        prefixes = [f"model.layers.{i}" for i in range(cfg.num_layers)]
        self.layers = nn.ModuleList(
            DecoderLayer(
                cfg, switches, self.rotary, backend, tp, p, self.build_mlp(i, p),
                self.attention_kind(i),
            )
            for i, p in enumerate(prefixes)
        )  # fmt: skip
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = ParallelLMHead(cfg.hidden_size, cfg.vocab_size, tp)

    def build_mlp(self, layer: int, prefix: str) -> nn.Module:
        """The MLP of layer ``layer`` (``prefix``: the checkpoint's name of the layer): the
        dense one; a mixture-of-experts family puts its MoE block where its config says."""
        return MLP(self.config, self.tp, f"{prefix}.mlp")

    def attention_kind(self, layer: int) -> Mapping[str, Any]:
        """``Attention``'s ``sliding_window``, ``sinks``, ``softcap`` and ``scale`` for layer
        ``layer`` where they are not the defaults: its window from ``layer_windows``."""
        windows = self.config.layer_windows
        return {"sliding_window": windows[layer]} if windows else {}

    def checkpoint_tensors(self) -> Mapping[str, tuple[str, Any]]:
        """Checkpoint tensor names within a layer (``mlp.experts.3.up_proj.weight``) that
        this model's parameters take under another name or as a part: → (the parameter
        within the layer, the shard id the loader hands its weight loader). The loader
        maps the dense names (q/k/v, gate/up) itself."""
        return {}

    def checkpoint_name(self, name: str) -> str | None:
        """A checkpoint tensor's name as a text-only checkpoint spells it (``model.layers.3
        ...``); None for a tensor this model does not take (another modality's)."""
        return name

    def forward(
        self,
        input_ids,
        positions,
        kv_caches: list[KVCache],
        meta: StepMetadata,
        out_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The last layer's hidden states of every row, or of rows ``out_rows`` alone (in
        that order). Every row's keys and values go to the cache either way, but in the last
        layer nothing else of a row is ever read unless its hidden state is: there the
        output projection and the MLP run on rows ``out_rows`` alone. In a prefill step
        that is one row per prompt: 6 % of the 134M model's matmul work skipped."""
        hidden, residual = self.run_layers(
            self.embed(input_ids), positions, kv_caches, meta, out_rows
        )
        return residual + hidden

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The tokens' input to the first layer: their embeddings."""
        return self.embed_tokens(input_ids)

    def run_layers(
        self,
        hidden: torch.Tensor,
        positions,
        kv_caches: list[KVCache],
        meta: StepMetadata,
        out_rows: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``meta``: the step's, or each layer's (a model of several KV groups; a
        linear-attention layer's ``StateMetadata``, its ``kv_caches`` entry its state
        tensors). ``forward``
        from the embedded tokens ``hidden`` (which become the residual
        stream's buffer, updated in place) to the last layer's (hidden, residual), whose sum
        is ``forward``'s result. A later pipeline stage starts from the previous stage's
        (hidden, residual) and runs its ``stage`` of layers alone."""
        last = len(self.layers) - 1
        metas: list[Any] = meta if isinstance(meta, list) else [meta] * len(self.layers)
        assert len(kv_caches) == len(metas) == len(self.layers)
        for i in self.stage or range(len(self.layers)):
            rows = out_rows if i == last else None
            hidden, residual = self.layers[i](
                positions, hidden, residual, kv_caches[i], metas[i], rows
            )
        assert residual is not None  # config.json names at least one layer
        return hidden, residual

    @classmethod
    def check_pipeline(cls, cfg: ModelConfig, size: int) -> None:
        """``ValueError`` unless this model splits in ``size`` pipeline stages: its step must
        be the shared decoder's (not hybrid linear attention, not Gemma's own forward)."""
        own_step = cls.forward is not DecoderLM.forward or cls.logits is not DecoderLM.logits
        if cfg.linear_layers or own_step:
            raise ValueError(
                f"pipeline_parallel_size {size}: {cfg.architecture} (family {cfg.family}) "
                "cannot be split in pipeline stages; only the shared decoder's families "
                "(Llama, Mistral, Qwen2, Qwen3 and their MoE models) can"
            )
        PipelineParallel(size=size).layers(cfg.num_layers)

    def keep_stage(self, pp: PipelineParallel) -> None:
        """Keep pipeline stage ``pp``'s parts alone (before its weights load): its layers,
        the embedding on the first stage, the final norm and LM head on the last."""
        self.check_pipeline(self.config, pp.size)
        self.stage = pp.layers(len(self.layers))
        for i in range(len(self.layers)):
            if i not in self.stage:
                self.layers[i] = MissingLayer()
        if not pp.is_first:
            self.embed_tokens = MissingLayer()  # type: ignore[assignment]
        if not pp.is_last:
            self.norm = MissingLayer()  # type: ignore[assignment]
            self.lm_head = MissingLayer()  # type: ignore[assignment]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()
