"""A verification step's attention as a decode batch: every row its own sequence.

Row ``j`` of a request whose ``q`` rows end at sequence length ``L`` attends to the first
``L - q + 1 + j`` tokens of the request's blocks (its own key and value stored with the
others before attention), which is what a decode query of that length reads through the
same block table. So a step of decoding requests that verify drafts runs the decode
kernel, one query per row, and on a CPU replays a recorded decode step of as many rows
(``graphs/cpu_graphs``) instead of running its layers eagerly through the prefill path.
"""

import numpy as np


def as_decode_rows(
    query_lens: list[int], seq_lens: list[int], tables: np.ndarray
) -> tuple[list[int], list[int], np.ndarray]:
    """Query lengths (all 1), sequence lengths and block tables of the step's sequences as
    one sequence per row; ``tables``: each sequence's block table (``[sequences, width]``)
    or its row of them (``[sequences]``: the runner's ``InputBatch`` rows)."""
    rows = [end - q + 1 + j for q, end in zip(query_lens, seq_lens, strict=True) for j in range(q)]
    return [1] * len(rows), rows, np.repeat(tables, query_lens, axis=0)
