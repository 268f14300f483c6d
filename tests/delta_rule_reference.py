"""The gated delta rule token by token in float64: the oracle of the delta-rule and Gated
DeltaNet tests (written from the recurrence, not from any kernel under test)."""

import torch


def random_inputs(
    num_tokens: int, hk: int, hv: int, dk: int, dv: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """float32 ``q``, ``k`` ``[T, Hk, Dk]``, ``v`` ``[T, Hv, Dv]``, log decay ``g`` in
    ``[-1, 0)`` and ``beta`` in ``(0, 1)`` ``[T, Hv]``."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(num_tokens, hk, dk, generator=gen),
        "k": torch.randn(num_tokens, hk, dk, generator=gen),
        "v": torch.randn(num_tokens, hv, dv, generator=gen),
        "g": -torch.rand(num_tokens, hv, generator=gen) - 1e-3,
        "beta": torch.rand(num_tokens, hv, generator=gen),
    }


def recurrent_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence (``q``, ``k`` ``[L, Hk, Dk]``, ``v`` ``[L, Hv, Dv]``, ``g``, ``beta``
    ``[L, Hv]``) from ``initial`` ``[Hv, Dk, Dv]`` (zeros if None), float64: (``o``
    ``[L, Hv, Dv]``, final state)."""
    hv, dk, dv = v.shape[1], q.shape[2], v.shape[2]
    group = hv // q.shape[1]
    s = torch.zeros(hv, dk, dv, dtype=torch.float64) if initial is None else initial.double()
    out = torch.zeros(v.shape, dtype=torch.float64)
    for t in range(v.shape[0]):
        for h in range(hv):
            qt, kt = q[t, h // group].double(), k[t, h // group].double()
            qt = qt / torch.sqrt((qt * qt).sum() + 1e-6) / dk**0.5
            kt = kt / torch.sqrt((kt * kt).sum() + 1e-6)
            s[h] = s[h] * torch.exp(g[t, h].double())
            s[h] = s[h] + beta[t, h].double() * torch.outer(kt, v[t, h].double() - s[h].T @ kt)
            out[t, h] = s[h].T @ qt
    return out, s
