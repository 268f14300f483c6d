"""The inputs of a replayed decode step: tensors at fixed addresses that each step's batch is
copied into, shared by the CUDA graphs (``cuda_graphs``: padded to a captured size, the
padding rows writing nothing) and the CPU's recorded steps (``cpu_graphs``: at their own
size). A model of several KV groups has a slot mapping and block tables per group, and one
with linear-attention layers the state slots and their flags, each at a fixed address too."""

from collections.abc import Sequence
from dataclasses import replace

import torch

from kvserve.engine.layers.attention.metadata import AttentionMetadata
from kvserve.engine.layers.linear_attention.metadata import StateMetadata
from kvserve.engine.models.decoder import StepMetadata

STATE = -1
"""A linear-attention layer's entry of a layout: its state slot, not a KV group."""


def step_metas(
    meta: StepMetadata, layout: Sequence[int]
) -> dict[int, AttentionMetadata | StateMetadata]:
    """Each KV group's ``AttentionMetadata`` of a step's ``meta`` (a layout's ``STATE``
    entry: its ``StateMetadata``), as ``ModelRunner.prepare`` lays them out per layer."""
    if not isinstance(meta, list):
        return {0: meta}
    return {group: meta[layer] for layer, group in enumerate(layout)}


def attention_part(meta: StepMetadata, layout: Sequence[int]) -> AttentionMetadata:
    """The first ``AttentionMetadata`` of a step's ``meta`` (they share their lengths)."""
    metas = step_metas(meta, layout)
    return next(m for m in metas.values() if isinstance(m, AttentionMetadata))


def laid_out(
    metas: dict[int, AttentionMetadata | StateMetadata], layout: tuple[int, ...]
) -> StepMetadata:
    """The step metadata of each KV group's (or ``STATE``'s) part, as ``layout`` orders
    them per layer; empty: group 0's, for every layer."""
    if not layout:
        meta = metas[0]
        assert isinstance(meta, AttentionMetadata)
        return meta
    return [metas[group] for group in layout]


class StaticDecodeBatch:
    """Input tensors of fixed address for decode batches of up to ``max_size`` sequences,
    each with a block table of ``max_blocks_per_seq`` entries per KV group.

    ``layout``: each layer's KV group, or ``STATE`` for a linear-attention layer (as
    ``ModelRunner.layer_groups`` with those marked); empty: one group serves every layer and
    the step's metadata is one ``AttentionMetadata``."""

    def __init__(
        self,
        max_size: int,
        max_blocks_per_seq: int,
        device: torch.device,
        layout: Sequence[int] = (),
    ) -> None:
        self.layout = tuple(layout)
        groups = max(self.layout, default=0) + 1
        self.input_ids = torch.zeros(max_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((groups, max_size), -1, dtype=torch.long, device=device)
        self.query_start_loc = torch.arange(max_size + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_size, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(
            groups, max_size, max_blocks_per_seq, dtype=torch.int32, device=device
        )
        self.state_slots = torch.zeros(max_size, dtype=torch.int32, device=device)
        self.has_initial_state = torch.zeros(max_size, dtype=torch.bool, device=device)

    def meta(self, size: int) -> StepMetadata:
        """The first ``size`` rows as a decode batch (host lengths are placeholders: the
        Triton path reads only the device tensors, ``num_seqs`` and ``max_query_len``)."""
        metas: dict[int, AttentionMetadata | StateMetadata] = {
            group: AttentionMetadata(
                slot_mapping=self.slot_mapping[group, :size],
                query_start_loc=self.query_start_loc[: size + 1],
                seq_lens=self.seq_lens[:size],
                block_tables=self.block_tables[group, :size],
                query_lens_host=[1] * size,
                seq_lens_host=[1] * size,
                max_query_len=1,
                max_seq_len=1,
            )
            for group in range(self.slot_mapping.shape[0])
        }
        metas[STATE] = StateMetadata(
            query_start_loc=self.query_start_loc[: size + 1],
            state_slots=self.state_slots[:size],
            has_initial_state=self.has_initial_state[:size],
            query_start_loc_host=list(range(size + 1)),
        )
        return laid_out(metas, self.layout)

    def bound(self, meta: StepMetadata) -> StepMetadata:
        """A filled step's ``meta`` with its device tensors the static ones (its host lengths
        kept)."""
        n = attention_part(meta, self.layout).num_seqs
        metas: dict[int, AttentionMetadata | StateMetadata] = {}
        for group, part in step_metas(meta, self.layout).items():
            if isinstance(part, StateMetadata):
                metas[group] = replace(
                    part,
                    query_start_loc=self.query_start_loc[: n + 1],
                    state_slots=self.state_slots[:n],
                    has_initial_state=self.has_initial_state[:n],
                )
            else:
                metas[group] = replace(
                    part,
                    slot_mapping=self.slot_mapping[group, :n],
                    query_start_loc=self.query_start_loc[: n + 1],
                    seq_lens=self.seq_lens[:n],
                    block_tables=self.block_tables[group, :n],
                )
        return laid_out(metas, self.layout)

    def fits(self, meta: StepMetadata) -> bool:
        """Whether every group's block tables fit the static ones."""
        width = self.block_tables.shape[2]
        metas = step_metas(meta, self.layout).values()
        tables = [m.block_tables for m in metas if isinstance(m, AttentionMetadata)]
        return all(table.shape[1] <= width for table in tables)

    def fill(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: StepMetadata, size: int
    ) -> None:
        """Copy a decode batch of ``num_seqs <= size`` sequences into the first rows and make
        rows up to ``size`` padding. Block-table columns past the batch's own width keep
        stale ids: they lie past every context and are never read."""
        attention = attention_part(meta, self.layout)
        n = attention.num_seqs
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.seq_lens[:n].copy_(attention.seq_lens)
        self.seq_lens[n:size].fill_(1)
        for group, part in step_metas(meta, self.layout).items():
            if isinstance(part, StateMetadata):
                self.state_slots[:n].copy_(part.state_slots)
                self.has_initial_state[:n].copy_(part.has_initial_state)
                continue
            self.slot_mapping[group, :n].copy_(part.slot_mapping)
            self.slot_mapping[group, n:size].fill_(-1)
            self.block_tables[group, :n, : part.block_tables.shape[1]].copy_(part.block_tables)
