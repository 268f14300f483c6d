"""The batch's grammar masks: one bitmask for the constrained rows, applied in one call."""

from collections.abc import Sequence

import torch

from kvserve.engine.device_copy import to_device
from kvserve.engine.structured.matcher import RequestGrammar


def apply_grammar_masks(
    logits: torch.Tensor, grammars: Sequence[RequestGrammar | None]
) -> torch.Tensor:
    """``logits`` with every token a row's grammar forbids at -inf (rows without a grammar
    unchanged). Writes in place: pass a tensor the caller owns. The bitmask is filled on
    the host (one C++ call per constrained row) and applied by xgrammar's kernel for the
    device, on the constrained rows only."""
    import xgrammar

    rows = [row for row, grammar in enumerate(grammars) if grammar is not None]
    if not rows:
        return logits
    bitmask = xgrammar.allocate_token_bitmask(len(grammars), logits.shape[1])
    for row, grammar in enumerate(grammars):
        if grammar is not None:
            grammar.fill_bitmask(bitmask, row)
    xgrammar.apply_token_bitmask_inplace(logits, to_device(bitmask, logits.device), indices=rows)
    return logits
