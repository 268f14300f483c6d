"""What the attention kernels need to know about one flat step batch."""

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Layout of one flat, unpadded step batch, shared by every attention backend.

    The batch concatenates the scheduled tokens of ``num_seqs`` sequences. The
    tokens of sequence ``i`` are rows ``query_start_loc[i]:query_start_loc[i+1]``;
    they are the last ``query_lens[i]`` tokens of a context of ``seq_lens[i]``
    tokens, so row ``j`` of sequence ``i`` sits at position
    ``seq_lens[i] - query_lens[i] + j`` and attends causally to positions
    ``0..`` its own. Before attention runs, the new tokens' keys and values are
    written to ``slot_mapping`` (a slot is ``block_id * block_size + offset``),
    so the whole context of every sequence is read from the paged cache through
    ``block_tables`` (row ``i`` lists sequence ``i``'s blocks in order; entries
    past its last block are padding and must not be read).

    Device tensors feed the kernels; the host lists (same values) let the torch
    path split the batch without a device sync.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    query_lens_host: list[int]
    seq_lens_host: list[int]
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)
