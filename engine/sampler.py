"""Logits of a batch → one next token per row, in a few tensor ops."""

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvserve.engine.core.outputs import Logprob
from kvserve.engine.core.request import Request
from kvserve.engine.device_copy import to_device
from kvserve.engine.host_copy import to_host, to_host_packed
from kvserve.engine.kernels.row_argmax import row_argmax
from kvserve.engine.sampling_rows import GREEDY, MIN_P, TEMPERATURE, TOP_K, TOP_P, StepParams
from kvserve.engine.sampling_state import SamplingState, StepRows
from kvserve.engine.structured.bitmask import apply_grammar_masks


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[Logprob | None]  # one per row; None where the request did not ask
    tokens: torch.Tensor  # token_ids on the logits' device (async scheduling feeds them on)
    also: list[list[list[float]]]  # the rows of the call's ``also`` tables, on the host


def _flat_index(rows: Sequence[Sequence[int]], device: torch.device):
    """``(row index, column)`` tensors for ragged per-row lists of columns."""
    row_ids = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor([len(r) for r in rows]))
    cols = list(itertools.chain.from_iterable(rows))
    return to_device(row_ids, device), to_device(cols, device, torch.long)


def logprob_table(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> torch.Tensor:
    """On the device, a row per row of ``logits``: ``token_ids``, the log-softmax at it and
    the top ``k`` log-softmax values and their ids (float64 columns; ``read_logprobs``)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, token_ids[:, None])
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (chosen[:, :0], chosen[:, :0])
    columns = [token_ids[:, None], chosen, top_values, top_ids]
    return torch.cat([c.double() for c in columns], dim=1)


def read_logprobs(table: list[list[float]], num_top: Sequence[int]) -> list[Logprob]:
    """A ``logprob_table`` on the host as ``Logprob``s, ``num_top[row]`` alternatives each."""
    found = []
    for row, n in zip(table, num_top, strict=True):
        k = (len(row) - 2) // 2
        top = zip((int(i) for i in row[2 + k : 2 + k + n]), row[2 : 2 + n], strict=True)
        found.append(Logprob(int(row[0]), row[1], tuple(top)))
    return found


class Sampler:
    """First logit bias, penalties, the ``min_tokens`` ban of EOS and stop ids (not for
    constrained rows: their grammar decides where EOS may come) and the grammar masks of
    constrained rows change the logits (each a scatter, index_put or bitmask kernel over
    the batch, run only when a row uses it). Penalties and ``min_tokens`` read each
    request's history in ``state`` (``SamplingState``: kept on the device, each call adds
    the tokens it sampled), never the request's tokens on the host. Then greedy rows take
    the argmax; the others apply temperature, top-k, top-p and min-p as masks, and draw
    with the exponential race (argmax of probs / Exp(1) noise). Seeded rows draw their
    noise from their own generator, so a seed fixes the output whatever else is batched.
    Their parameters are the rows' ``StepParams`` (gathered by row from ``state.params``,
    written once a request); which filters run is decided from its host copy: no device
    sync.
    Log-probabilities come from the raw logits (see ``SamplingParams``)."""

    def __init__(
        self, eos_token_ids: Collection[int] = (), state: SamplingState | None = None
    ) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self.state = SamplingState() if state is None else state

    def __call__(
        self,
        logits: torch.Tensor,
        requests: list[Request],
        rows: StepRows | None = None,
        also: Sequence[torch.Tensor] = (),
    ) -> SamplerOutput:
        """One token per row of ``logits`` (``requests``' rows, in order; ``rows``: their
        slots in ``state``, handed out now if not given), with the log-probabilities asked
        for, in one device → host copy that carries the 2-D tables of ``also`` too (the
        step's prompt log-probabilities)."""
        rows = self.state.rows(requests) if rows is None else rows
        tokens = self._sample(self.adjust_logits(logits, requests, rows), requests, rows.params)
        wanted = [r.params.logprobs for r in requests]
        num_top = [n or 0 for n in wanted]
        asked = any(n is not None for n in wanted)
        found: list[Logprob | None] = [None] * len(requests)
        if not asked and not also:
            token_ids, host = to_host(tokens), []
        else:
            table = logprob_table(logits, tokens, max(num_top)) if asked else tokens[:, None]
            host = to_host_packed([table, *also])
            token_ids = [int(row[0]) for row in host[0]]
            if asked:
                read = read_logprobs(host[0], num_top)
                found = [lp if n is not None else None for lp, n in zip(read, wanted, strict=True)]
            host = host[1:]
        rows.record(logits, tokens)  # last: a call that raised recorded nothing
        return SamplerOutput(token_ids, found, tokens, host)

    @staticmethod
    def takes_argmax(request: Request) -> bool:
        """Whether the token this sampler gives ``request`` now, and after any tokens it
        appends, is the argmax of its raw logits row: greedy, without logit bias, penalties,
        a grammar or log-probabilities, its ``min_tokens`` reached."""
        p = request.params
        return (
            p.greedy
            and not p.logit_bias
            and not (p.presence_penalty or p.frequency_penalty)
            and p.repetition_penalty == 1
            and p.logprobs is None
            and request.grammar is None
            and request.num_output_tokens >= p.min_tokens
        )

    def adjust_logits(
        self, logits: torch.Tensor, requests: list[Request], rows: StepRows | None = None
    ) -> torch.Tensor:
        rows = self.state.rows(requests) if rows is None else rows
        params = [r.params for r in requests]
        device, raw = logits.device, logits
        if any(p.logit_bias for p in params):
            index = _flat_index([list(p.logit_bias) for p in params], device)
            bias = [v for p in params for v in p.logit_bias.values()]
            values = to_device(bias, device, logits.dtype)
            logits = logits.index_put(index, values, accumulate=True)
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            counts = rows.counts(logits).to(logits.dtype)
            frequency = to_device([p.frequency_penalty for p in params], device)
            presence = to_device([p.presence_penalty for p in params], device)
            present = rows.present(logits)
            logits = logits - frequency[:, None] * counts - presence[:, None] * present
        if any(p.repetition_penalty != 1 for p in params):
            penalty = to_device([p.repetition_penalty for p in params], device)[:, None]
            penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
            logits = torch.where(rows.seen(logits), penalised, logits)
        # The host's output count lags the device's (tokens in flight), never leads it: a
        # row it says is done is done; the others are banned where the device's count says.
        banned = [
            [*self.eos_token_ids, *r.params.stop_token_ids]
            if r.num_output_tokens < r.params.min_tokens and r.grammar is None
            else []
            for r in requests
        ]
        if any(banned):
            index = _flat_index(banned, device)
            min_tokens = to_device([p.min_tokens for p in params], device, torch.int32)
            unmet = (rows.num_outputs(logits) < min_tokens)[index[0]]
            logits = logits.index_put(index, torch.where(unmet, -torch.inf, logits[index]))
        grammars = [r.grammar for r in requests]
        if any(grammars):
            # In place, unless the raw logits are still wanted for log-probabilities.
            wants_raw = logits is raw and any(p.logprobs is not None for p in params)
            logits = apply_grammar_masks(logits.clone() if wants_raw else logits, grammars)
        return logits

    def _sample(
        self, logits: torch.Tensor, requests: list[Request], params: StepParams
    ) -> torch.Tensor:
        params.settle(logits.device)
        if params.greedy:
            return row_argmax(logits)
        device = logits.device
        temperatures = params.column(TEMPERATURE, np.float32, device)
        logits = self._filter(logits / temperatures[:, None], params)
        probs = torch.softmax(logits, dim=-1)
        noise = torch.empty_like(probs).exponential_()
        for row, request in enumerate(requests):
            if request.generator is not None:
                row_noise = torch.empty(probs.shape[1]).exponential_(generator=request.generator)
                noise[row] = to_device(row_noise, device)
        sampled = row_argmax(probs / noise)
        greedy = params.column(GREEDY, np.bool_, device)
        return torch.where(greedy, row_argmax(logits), sampled)

    @staticmethod
    def _filter(logits: torch.Tensor, params: StepParams) -> torch.Tensor:
        """Top-k, top-p and min-p, each where a row of ``params.host`` asks for it."""
        device, vocab, host = logits.device, logits.shape[1], params.host
        if ((host[:, TOP_K] < vocab) | (host[:, TOP_P] < 1)).any():
            top_k = params.column(TOP_K, np.int64, device).clamp(max=vocab)
            top_p = params.column(TOP_P, np.float32, device)
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab, device=device)[None, :]
            drop = ranks >= top_k[:, None]
            sorted_probs = sorted_logits.masked_fill(drop, -torch.inf).softmax(dim=-1)
            drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p[:, None]
            drop[:, 0] = False  # a top_p below float32's range rounds to 0: keep the top token
            logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, -torch.inf))
        if (host[:, MIN_P] > 0).any():
            min_p = params.column(MIN_P, np.float32, device)
            probs = logits.softmax(dim=-1)
            threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, -torch.inf)
        return logits
