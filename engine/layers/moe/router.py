"""Routing: a token's router logits over the experts → the experts it goes through and the
weight of each one's output. A routing is any callable of ``Routing``'s shape; the MoE
block takes one, so a family with another rule brings its own."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

Routing = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``logits [T, E]`` → ``(weights [T, K] float32, ids [T, K] int32)``: token t's output
is ``sum_k weights[t, k] * expert_{ids[t, k]}(x_t)``."""


@dataclass(frozen=True)
class SoftmaxTopK:
    """Qwen-MoE's and Mixtral's rule: softmax over every expert (in float32), keep the
    ``top_k`` largest probabilities, and, if ``renormalize`` (``norm_topk_prob``; always
    for Mixtral), divide them by their sum."""

    top_k: int
    renormalize: bool

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        return weights, ids.to(torch.int32)


@dataclass(frozen=True)
class TopKSoftmax:
    """gpt-oss's rule: the ``top_k`` largest logits, then a softmax over those alone."""

    top_k: int

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=torch.float32), ids.to(torch.int32)
