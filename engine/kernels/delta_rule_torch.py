"""The gated delta rule in torch ops: the CPU path, and the oracle shape of the Triton one.

Per value head ``h`` of a sequence, with state ``S`` ``[Dk, Dv]`` and token ``t``::

    q, k = l2norm(q_t), l2norm(k_t); q = q / sqrt(Dk)
    S = exp(g_t) * S
    S = S + beta_t * k ⊗ (v_t - Sᵀ k)
    o_t = Sᵀ q

Grouped heads: value head ``h`` reads query/key head ``h // (Hv // Hk)``. ``g`` (log decay,
``<= 0``) and ``beta`` are float32 ``[tokens, Hv]``. The state of sequence ``i`` lives at
``state[slots[i]]`` (``[num_slots, Hv, Dk, Dv]``, any float dtype); it starts from zeros
where ``has_state[i]`` is false, and the final state is written back there. Every sum is
accumulated in float32; the output has ``v``'s dtype.

``gated_delta_rule_chunked`` (prefill, a flat ragged batch cut by ``cu_seqlens``) runs
chunks of ``chunk_size`` tokens in the WY/UT form: within a chunk, with ``G`` the cumulative
log decay and ``D[i, j] = exp(G_i - G_j)`` for ``j <= i``, ``T = (I + tril₋₁(diag(β) K Kᵀ ∘
D))⁻¹``; ``U = T diag(β) V`` and ``W = T diag(β e^G) K`` turn the chunk's updates into
``V' = U - W S``, ``O = diag(e^G) Q S + tril(Q Kᵀ ∘ D) V'`` and
``S' = e^{G_last} S + (K ∘ e^{G_last - G})ᵀ V'``. ``gated_delta_rule_step`` (decode) takes one
token per sequence.
"""

import itertools

import torch

from kvserve.engine.kernels.slot_states import initial_states

L2_EPS = 1e-6
CHUNK_SIZE = 64


def normalized_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q``, ``k`` ``[..., Hk, Dk]`` → float32 ``[..., Hv, Dk]``: L2-normalised, ``q``
    scaled by ``Dk ** -0.5``, each key head repeated for its value heads."""
    group = num_v_heads // q.shape[-2]
    q, k = q.float(), k.float()
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS) * q.shape[-1] ** -0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    return q.repeat_interleave(group, dim=-2), k.repeat_interleave(group, dim=-2)


def gated_delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence: ``q``, ``k`` ``[B, Hk, Dk]``, ``v`` ``[B, Hv, Dv]``, ``g``,
    ``beta`` ``[B, Hv]``; returns ``o`` ``[B, Hv, Dv]`` and updates ``state[slots]``."""
    q32, k32 = normalized_qk(q, k, v.shape[1])
    s = initial_states(state, slots, has_state) * g.float().exp()[..., None, None]
    delta = (v.float() - torch.einsum("bhkv,bhk->bhv", s, k32)) * beta.float()[..., None]
    s = s + k32[..., :, None] * delta[..., None, :]
    state[slots.long()] = s.to(state.dtype)
    return torch.einsum("bhkv,bhk->bhv", s, q32).to(v.dtype)


def _chunked_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, heads first (``q``, ``k`` ``[H, L, Dk]``, ``v`` ``[H, L, Dv]``, ``g``,
    ``beta`` ``[H, L]``, all float32), from state ``s`` ``[H, Dk, Dv]``: (``o``, final ``s``)."""
    out = torch.empty_like(v)
    for c0 in range(0, v.shape[1], chunk_size):
        c1 = min(c0 + chunk_size, v.shape[1])
        qc, kc, vc, bc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1, None]
        cum = g[:, c0:c1].cumsum(-1)
        n = c1 - c0
        upper = torch.ones(n, n, dtype=torch.bool, device=v.device).triu(1)
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(upper, float("-inf")).exp()
        system = ((kc * bc) @ kc.transpose(-1, -2) * decay).tril(-1)
        system = system + torch.eye(n, dtype=v.dtype, device=v.device)
        u = torch.linalg.solve_triangular(system, vc * bc, upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(
            system, kc * (bc * cum.exp()[..., None]), upper=False, unitriangular=True
        )
        v_new = u - w @ s
        attn = qc @ kc.transpose(-1, -2) * decay
        out[:, c0:c1] = (qc * cum.exp()[..., None]) @ s + attn @ v_new
        last = cum[:, -1:]
        s = (
            s * last.exp()[..., None]
            + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ v_new
        )
    return out, s


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: list[int],
    state: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """A flat ragged batch: sequence ``i`` is rows ``cu_seqlens[i]:cu_seqlens[i + 1]`` of
    ``q``, ``k`` ``[T, Hk, Dk]``, ``v`` ``[T, Hv, Dv]``, ``g``, ``beta`` ``[T, Hv]``. Returns
    ``o`` ``[T, Hv, Dv]`` and leaves each sequence's final state in ``state[slots[i]]``."""
    q32, k32 = normalized_qk(q, k, v.shape[1])
    s0 = initial_states(state, slots, has_state)
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    finals = []
    for i, (start, end) in enumerate(itertools.pairwise(cu_seqlens)):
        qs, ks, vs, gs, bs = (x[start:end].transpose(0, 1).float() for x in (q32, k32, v, g, beta))
        o, s = _chunked_sequence(qs, ks, vs, gs, bs, s0[i], chunk_size)
        out[start:end] = o.transpose(0, 1)
        finals.append(s)
    if finals:
        state[slots.long()] = torch.stack(finals).to(state.dtype)
    return out.to(v.dtype)
