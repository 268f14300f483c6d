"""The inputs of a replayed decode step: tensors at fixed addresses that each step's batch is
copied into, shared by the CUDA graphs (``cuda_graphs``: padded to a captured size, the
padding rows writing nothing) and the CPU's recorded steps (``cpu_graphs``: at their own
size)."""

import torch

from kvserve.engine.layers.attention.metadata import AttentionMetadata


class StaticDecodeBatch:
    """Input tensors of fixed address for decode batches of up to ``max_size`` sequences,
    each with a block table of ``max_blocks_per_seq`` entries."""

    def __init__(self, max_size: int, max_blocks_per_seq: int, device: torch.device) -> None:
        self.input_ids = torch.zeros(max_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_size,), -1, dtype=torch.long, device=device)
        self.query_start_loc = torch.arange(max_size + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_size, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(
            max_size, max_blocks_per_seq, dtype=torch.int32, device=device
        )

    def meta(self, size: int) -> AttentionMetadata:
        """The first ``size`` rows as a decode batch (host lengths are placeholders: the
        Triton path reads only the device tensors, ``num_seqs`` and ``max_query_len``)."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            query_lens_host=[1] * size,
            seq_lens_host=[1] * size,
            max_query_len=1,
            max_seq_len=1,
        )

    def fill(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, size: int
    ) -> None:
        """Copy a decode batch of ``meta.num_seqs <= size`` sequences into the first rows
        and make rows up to ``size`` padding. Block-table columns past the batch's own
        width keep stale ids: they lie past every context and are never read."""
        n = meta.num_seqs
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.seq_lens[:n].copy_(meta.seq_lens)
        self.seq_lens[n:size].fill_(1)
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
