"""The running requests' block tables, kept from step to step (on the host, and on a device
other than the CPU a copy there), so that a step's block tables and slot mappings are
gathered by row instead of rebuilt from every request's lists."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvserve.engine.core.request import Request
from kvserve.engine.device_copy import to_device


@dataclass(slots=True)
class _Held:
    """What a row copied of its request: each group's table list (the request's own list,
    compared by identity), how many of its entries, and how many of them were null."""

    request: Request
    tables: list[list[int]]
    lengths: list[int]
    skipped: list[int]


class InputBatch:
    """Rows of block tables, ``max_num_seqs`` of them: a request holds a row from the first
    step that schedules it, with its table of every KV group in ``host[group, row]`` (numpy)
    and, on a device other than the CPU, the same in ``on_device[group, row]`` (on the CPU,
    None: a step's tables are gathered from ``host``, faster there than through torch).

    ``rows`` brings a scheduled request's row up to date from ``Request.block_tables``, which
    keeps this invariant: a table list is only appended to or has leading entries set to the
    null block (``Request.num_skipped_blocks`` counts them); any other change replaces the
    list. So a row copies what was appended since the last step (in decode, one entry every
    ``block_size`` tokens), a sliding window's new null entries, or a whole table the request
    did not have before (a new or resumed request, rejected drafts' blocks dropped). The rows
    changed on the host go to ``on_device`` in one copy, before the next gather there.

    A row is given back when a request needs one and none is free: first those whose request
    no longer holds the tables they copied (finished, preempted), then those of requests the
    step does not schedule. A row is a cache of its request's tables: a request that has lost
    its row is copied whole into a new one. Entries of a row past its table's length are
    stale and never read (a step's tables are as wide as its longest, and attention reads a
    table only up to its sequence's length).

    Not thread-safe: the engine thread calls it while it prepares a step; what it hands out
    (gathered tensors and arrays) is the step's own, so a step in flight never sees a later
    step's changes.
    """

    def __init__(
        self,
        num_groups: int,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.device = device
        shape = (num_groups, max_num_seqs, max_blocks_per_seq)
        self.host = np.zeros(shape, dtype=np.int32)
        self.on_device: torch.Tensor | None = None
        if device.type != "cpu":
            self.on_device = torch.zeros(shape, dtype=torch.int32, device=device)
        self.num_blocks = np.zeros(max_num_seqs, dtype=np.int64)
        """Each row's table length (the first group's; every group's table is as long)."""
        self._held: list[_Held | None] = [None] * max_num_seqs
        self._row_of: dict[int, int] = {}  # id(request) → row; the row holds the request
        self._free = list(range(max_num_seqs - 1, -1, -1))  # popped from the end: row 0 first
        self._changed: set[int] = set()  # rows changed on the host since the last gather

    def rows(self, requests: Sequence[Request]) -> np.ndarray:
        """Each request's row, its tables brought up to date (a request without one placed in
        a free row)."""
        rows = []
        for request in requests:
            row = self._row_of.get(id(request))
            if row is None:
                row = self._place(request, requests)
            else:
                held = self._held[row]
                assert held is not None
                for group, table in enumerate(request.block_tables):
                    if (
                        table is not held.tables[group]
                        or len(table) != held.lengths[group]
                        or request.num_skipped_blocks[group] != held.skipped[group]
                    ):
                        self._copy(row, held, group)
            rows.append(row)
        return np.array(rows, dtype=np.int64)

    def block_tables(self, rows: np.ndarray, width: int) -> list[torch.Tensor]:
        """Each group's block tables of ``rows`` (``[len(rows), width]`` int32, on the
        device)."""
        if self.on_device is None:
            return [torch.from_numpy(tables) for tables in self.host[:, rows, :width]]
        if self._changed:
            changed = np.array(sorted(self._changed), dtype=np.int64)
            self._changed.clear()
            values = to_device(self.host[:, changed], self.device)
            self.on_device.index_copy_(1, to_device(changed, self.device), values)
        gathered = self.on_device[:, :, :width].index_select(1, to_device(rows, self.device))
        return list(gathered)

    def slot_mappings(self, token_rows: np.ndarray, positions: np.ndarray) -> list[np.ndarray]:
        """Each group's slot (``block_id * block_size + offset``, int64) of each token at
        ``positions`` of the request of row ``token_rows``."""
        block_size = np.int64(self.block_size)
        blocks, offsets = np.divmod(positions, block_size)
        return [tables[token_rows, blocks] * block_size + offsets for tables in self.host]

    def _place(self, request: Request, step: Sequence[Request]) -> int:
        if not self._free:
            self._give_back(step)
        row = self._free.pop()
        groups = len(request.block_tables)
        held = _Held(request, [[] for _ in range(groups)], [0] * groups, [0] * groups)
        self._held[row], self._row_of[id(request)] = held, row
        for group in range(groups):
            self._copy(row, held, group)
        return row

    def _copy(self, row: int, held: _Held, group: int) -> None:
        """Copy what changed of ``held.request``'s table of ``group`` into the row."""
        request = held.request
        table = request.block_tables[group]
        skipped = request.num_skipped_blocks[group]
        if table is not held.tables[group]:
            first = 0
        elif skipped != held.skipped[group]:
            first = held.skipped[group]
        else:
            first = held.lengths[group]
        if len(table) > self.host.shape[2]:
            raise ValueError(
                f"request {request.request_id} holds {len(table)} blocks, more than "
                f"max_blocks_per_seq ({self.host.shape[2]})"
            )
        self.host[group, row, first : len(table)] = table[first:]
        held.tables[group], held.lengths[group], held.skipped[group] = table, len(table), skipped
        if group == 0:
            self.num_blocks[row] = len(table)
        if self.on_device is not None:
            self._changed.add(row)

    def _give_back(self, step: Sequence[Request]) -> None:
        """Free the rows of requests not in ``step`` that no longer hold the tables they
        copied; failing any, those of every request not in ``step``."""
        scheduled = {id(r) for r in step}
        others = [
            (row, held)
            for row, held in enumerate(self._held)
            if held is not None and id(held.request) not in scheduled
        ]
        stale = [
            (row, held)
            for row, held in others
            if not held.request.block_tables or held.request.block_tables[0] is not held.tables[0]
        ]
        for row, held in stale or others:
            del self._row_of[id(held.request)]
            self._held[row] = None
            self._free.append(row)
        if not self._free:
            raise RuntimeError(f"a step of more than {len(self._held)} requests (max_num_seqs)")
