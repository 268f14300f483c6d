"""The mixture-of-experts facts of a checkpoint's config.json (Qwen2-MoE, Qwen3-MoE,
Mixtral, gpt-oss, Gemma 4's ``enable_moe_block``), as transformers spells them."""

from dataclasses import dataclass

from kvserve.engine.layers.activation import SWIGLU_ALPHA, SWIGLU_LIMIT


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    """``num_experts`` (Qwen) or ``num_local_experts`` (Mixtral)."""
    top_k: int
    """``num_experts_per_tok``: the experts each token's hidden state goes through."""
    intermediate_size: int
    """Each expert's: ``moe_intermediate_size`` (Qwen), else ``intermediate_size`` (Mixtral)."""
    norm_topk_prob: bool
    """``norm_topk_prob``: the top-k softmax probabilities renormalised to sum to 1 (always
    so for Mixtral)."""
    decoder_sparse_step: int = 1
    """``decoder_sparse_step``: layer i is sparse when ``(i + 1) % step == 0`` ..."""
    mlp_only_layers: tuple[int, ...] = ()
    """... and it is not in ``mlp_only_layers`` (those have the dense MLP)."""
    shared_expert_intermediate_size: int | None = None
    """``shared_expert_intermediate_size`` (Qwen2-MoE): a dense MLP every token goes through
    too, scaled by ``sigmoid(shared_expert_gate(x))``; None: no shared expert."""
    intermediate_name: str = "moe_intermediate_size"
    """config.json's name of ``intermediate_size``, for errors."""

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.top_k}) must be between 1 and the number of "
                f"experts ({self.num_experts})"
            )
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step must be >= 1, not {self.decoder_sparse_step}")

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has the MoE block rather than a dense MLP."""
        return (layer + 1) % self.decoder_sparse_step == 0 and layer not in self.mlp_only_layers

    @classmethod
    def from_dict(cls, raw: dict, family: str) -> "MoEConfig | None":
        """None for a dense config (no expert count)."""
        num_experts = raw.get("num_experts") or raw.get("num_local_experts")
        if not num_experts or (family == "gemma4" and not raw.get("enable_moe_block")):
            return None
        if family == "gemma4":  # experts beside the dense MLP in every layer, renormalised
            return cls(
                num_experts=num_experts,
                top_k=raw["top_k_experts"],
                intermediate_size=raw["moe_intermediate_size"],
                norm_topk_prob=True,
            )
        mixtral = family in ("mixtral", "gpt_oss")  # one intermediate_size, the experts'
        if family == "gpt_oss":
            _check_swiglu(raw)
        return cls(
            num_experts=num_experts,
            top_k=raw["num_experts_per_tok"],
            intermediate_size=raw["intermediate_size" if mixtral else "moe_intermediate_size"],
            norm_topk_prob=mixtral or bool(raw.get("norm_topk_prob", False)),
            decoder_sparse_step=raw.get("decoder_sparse_step") or 1,
            mlp_only_layers=tuple(raw.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=raw.get("shared_expert_intermediate_size") or None,
            intermediate_name="intermediate_size" if mixtral else "moe_intermediate_size",
        )


def _check_swiglu(raw: dict) -> None:
    """gpt-oss's clamped SwiGLU runs with its constants (``layers.activation``)."""
    for name, value in (("swiglu_alpha", SWIGLU_ALPHA), ("swiglu_limit", SWIGLU_LIMIT)):
        if raw.get(name, value) != value:
            raise ValueError(f"unsupported {name} {raw[name]!r}; gpt-oss's experts use {value}")
