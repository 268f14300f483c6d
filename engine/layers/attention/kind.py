"""What sets one layer's attention apart from plain causal attention: a sliding window,
attention sinks, logit soft-capping (``AttentionBackend.attend`` states each's meaning)."""

from typing import NamedTuple

import torch


class AttentionKind(NamedTuple):
    """A layer's ``window``, ``sinks`` and ``softcap`` as ``attend`` takes them; all None is
    plain causal attention, which every backend runs on its unchanged fast path."""

    window: int | None = None
    sinks: torch.Tensor | None = None
    softcap: float | None = None

    @property
    def plain(self) -> bool:
        return self.window is None and self.sinks is None and self.softcap is None

    def first_key(self, position: int) -> int:
        """The first key position that a query at ``position`` sees (0 without a window):
        every block before the one holding it may be freed and must not be read."""
        return 0 if self.window is None else max(0, position - self.window + 1)


PLAIN = AttentionKind()
