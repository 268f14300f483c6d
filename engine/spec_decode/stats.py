"""Counts of speculative decoding, as vLLM's ``vllm:spec_decode_*`` metrics count them."""

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    """Cumulative: ``num_drafts`` verified runs of draft tokens, ``num_draft_tokens`` in
    them, ``num_accepted_tokens`` of those the target model agreed with, and
    ``num_accepted_tokens_per_pos[i]`` the accepted drafts at position i of their run."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_drafts: int, num_accepted: int) -> None:
        """One run of ``num_drafts`` drafts whose first ``num_accepted`` were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.num_accepted_tokens_per_pos[position] += 1
