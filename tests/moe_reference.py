"""A plain per-expert float64 MoE, the oracle of the fused MoE kernel's tests, and routings
with chosen loads."""

import torch
import torch.nn.functional as F


def activate(gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(max=7.0)
    up = up.clamp(-7.0, 7.0)
    return (up + 1) * gate * torch.sigmoid(1.702 * gate)


def reference_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Expert by expert in float64: gather its tokens, run its MLP, add each output times its
    routing weight to its token's row."""
    x = hidden.double()
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for expert in range(w13.shape[0]):
        tokens, choices = (topk_ids == expert).nonzero(as_tuple=True)
        h = x[tokens] @ w13[expert].double().T
        if w13_bias is not None:
            h += w13_bias[expert].double()
        y = activate(h[:, :inter], h[:, inter:], activation) @ w2[expert].double().T
        if w2_bias is not None:
            y += w2_bias[expert].double()
        out.index_add_(0, tokens, y * topk_weights[tokens, choices, None].double())
    return out


def uneven_routing(tokens: int, top_k: int, num_experts: int, seed: int) -> torch.Tensor:
    """int32 ``[tokens, top_k]``: every token's first choice is expert 1 (it gets all the
    tokens), expert 0 gets none, the other choices are distinct experts from 2 up, at
    random (``top_k <= num_experts - 1``)."""
    generator = torch.Generator().manual_seed(seed)
    rows = [
        [1, *(2 + torch.randperm(num_experts - 2, generator=generator)[: top_k - 1]).tolist()]
        for _ in range(tokens)
    ]
    return torch.tensor(rows, dtype=torch.int32).reshape(tokens, top_k)
