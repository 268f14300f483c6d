"""The inputs of a replayed mixed step (decodes with small prefill chunks): tensors at fixed
addresses that each step is copied into, padded to its ``Bucket``.

Rows ``t..T`` of a step of ``t`` tokens padded to ``T`` write slot -1 (the Triton store
kernel writes nothing for them) and belong to no sequence; sequences ``n..S`` start and end
at token ``t`` (no query token: their attention programs return before reading anything
else). The hidden states out are rows ``rows[:S]``: the step's own (each sampling request's
last token, its drafts, prompt-logprob spans; every row where the step samples all), then
row 0 as padding. A model of several KV groups has a slot mapping and block tables per group.
"""

from collections.abc import Sequence

import torch

from kvserve.engine.graphs.graph_buckets import Bucket
from kvserve.engine.graphs.static_batch import (
    STATE,
    attention_part,
    laid_out,
    step_metas,
)
from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.models.decoder import StepMetadata


class StaticMixedBatch:
    """Input tensors of fixed address for steps of up to ``max_tokens`` tokens and
    ``max_seqs`` sequences, each with a block table of ``max_blocks_per_seq`` entries per
    KV group. ``layout``: each layer's KV group (``StaticDecodeBatch``'s; no ``STATE``: a
    linear-attention layer's padding rows would need a scratch state slot)."""

    def __init__(
        self,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        device: torch.device,
        layout: Sequence[int] = (),
    ) -> None:
        if STATE in layout:
            raise ValueError("a mixed step's static batch has no state slots")
        self.layout = tuple(layout)
        groups = max(self.layout, default=0) + 1
        self.input_ids = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((groups, max_tokens), -1, dtype=torch.long, device=device)
        self.query_start_loc = torch.zeros(max_seqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_seqs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(
            groups, max_seqs, max_blocks_per_seq, dtype=torch.int32, device=device
        )
        self.rows = torch.zeros(max_seqs, dtype=torch.long, device=device)
        self.every_row = torch.arange(max_seqs, dtype=torch.long, device=device)

    def meta(self, bucket: Bucket) -> StepMetadata:
        """The first rows as a step of ``bucket``'s shape (host lengths are placeholders:
        the Triton path reads only the device tensors, ``num_seqs`` and ``max_query_len``)."""
        tokens, seqs = bucket.tokens, bucket.seqs
        metas: dict[int, AttentionMetadata | StateMetadata] = {
            group: AttentionMetadata(
                slot_mapping=self.slot_mapping[group, :tokens],
                query_start_loc=self.query_start_loc[: seqs + 1],
                seq_lens=self.seq_lens[:seqs],
                block_tables=self.block_tables[group, :seqs],
                query_lens_host=[1] * seqs,
                seq_lens_host=[1] * seqs,
                max_query_len=bucket.max_query_len,
                max_seq_len=1,
            )
            for group in range(self.slot_mapping.shape[0])
        }
        return laid_out(metas, self.layout)

    def fits(self, meta: StepMetadata) -> bool:
        """Whether every group's block tables fit the static ones."""
        width = self.block_tables.shape[2]
        metas = step_metas(meta, self.layout).values()
        return all(
            m.block_tables.shape[1] <= width for m in metas if isinstance(m, AttentionMetadata)
        )

    def fill(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: StepMetadata,
        out_rows: torch.Tensor | None,
        bucket: Bucket,
    ) -> int:
        """Copy a step that ``bucket`` holds into the first rows and pad the rest up to its
        shape; returns how many hidden-state rows are the step's (``out_rows``, or every
        token's where None). Stale input ids and positions of padding tokens stay: they are
        valid ids and positions, and no sequence reads those rows. Block-table columns past
        the step's own width keep stale ids: they lie past every context and are never
        read."""
        attention = attention_part(meta, self.layout)
        tokens, n = input_ids.shape[0], attention.num_seqs
        self.input_ids[:tokens].copy_(input_ids)
        self.positions[:tokens].copy_(positions)
        self.query_start_loc[: n + 1].copy_(attention.query_start_loc)
        self.query_start_loc[n + 1 : bucket.seqs + 1].fill_(tokens)
        self.seq_lens[:n].copy_(attention.seq_lens)
        for group, part in step_metas(meta, self.layout).items():
            assert isinstance(part, AttentionMetadata)
            self.slot_mapping[group, :tokens].copy_(part.slot_mapping)
            self.slot_mapping[group, tokens : bucket.tokens].fill_(-1)
            self.block_tables[group, :n, : part.block_tables.shape[1]].copy_(part.block_tables)
        rows = self.every_row[:tokens] if out_rows is None else out_rows
        count = rows.shape[0]
        self.rows[:count].copy_(rows)
        self.rows[count : bucket.seqs].zero_()
        return count
