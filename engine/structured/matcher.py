"""One request's place in its grammar: waits for the compile, then follows every token."""

from concurrent.futures import Future, wait
from typing import Any

import torch


class RequestGrammar:
    """The grammar matcher of one request, created once its grammar's compile is done.

    Invariant: the matcher has accepted exactly the request's output tokens. Preemption
    keeps the output tokens (they are recomputed as prompt) and so keeps the matcher as
    it is; only newly sampled tokens advance it. ``is_terminated`` turns true when the
    grammar accepted a stop token (EOS), which the mask allows only where the grammar
    may end.
    """

    def __init__(self, compiled: Future) -> None:
        self._compiled = compiled
        self._matcher: Any = None

    @property
    def is_compiling(self) -> bool:
        return not self._compiled.done()

    def wait(self, timeout: float) -> None:
        """Block until the compile is done or ``timeout`` seconds passed."""
        wait([self._compiled], timeout)

    @property
    def error(self) -> BaseException | None:
        """Why the grammar cannot be used (once compiled), else ``None``."""
        return None if self.is_compiling else self._compiled.exception()

    @property
    def matcher(self) -> Any:
        if self._matcher is None:
            import xgrammar

            self._matcher = xgrammar.GrammarMatcher(self._compiled.result())
        return self._matcher

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Set ``bitmask[row]`` to the tokens allowed next (one bit per token id)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> None:
        """Advance by a sampled token; raises if the grammar refuses it (a masking bug)."""
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"the grammar refused the sampled token {token_id}")

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()
