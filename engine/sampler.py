"""Logits of a batch → one next token per row, in a few tensor ops."""

import torch
from kvserve.engine.request import Request
from kvserve.engine.sampling_params import SamplingParams


class Sampler:
    """Greedy rows take the argmax; the others apply temperature, then top-k,
    top-p and min-p as masks, and draw with the exponential race (argmax of
    probs / Exp(1) noise). Seeded rows draw their noise from their own
    generator, so a seed fixes the output whatever else is batched. Which
    filters run is decided from the host-side parameters: no device sync."""

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        params = [r.params for r in requests]
        if all(p.greedy for p in params):
            return logits.argmax(dim=-1)
        device = logits.device
        temps = torch.tensor([p.temperature or 1.0 for p in params], device=device)
        logits = self._filter(logits / temps[:, None], params)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs).exponential_()
        for row, request in enumerate(requests):
            if request.generator is not None:
                row_noise = torch.empty(probs.shape[1]).exponential_(generator=request.generator)
                noise[row] = row_noise.to(device)
        sampled = (probs / noise).argmax(dim=-1)
        greedy = torch.tensor([p.greedy for p in params], device=device)
        return torch.where(greedy, logits.argmax(dim=-1), sampled)

    @staticmethod
    def _filter(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        device, vocab = logits.device, logits.shape[1]
        if any(0 < p.top_k < vocab or p.top_p < 1 for p in params):
            top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
            top_p = torch.tensor([p.top_p for p in params], device=device)
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab, device=device)[None, :]
            drop = ranks >= top_k[:, None]
            sorted_probs = sorted_logits.masked_fill(drop, -torch.inf).softmax(dim=-1)
            drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p[:, None]
            logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, -torch.inf))
        if any(p.min_p > 0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], device=device)
            probs = logits.softmax(dim=-1)
            threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, -torch.inf)
        return logits
