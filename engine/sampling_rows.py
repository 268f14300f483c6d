"""Each running request's sampling parameters in a row, written once when the request gets
the row (they never change for a request), so that a step's temperature, top-k, top-p,
min-p and greedy columns are gathered by row instead of rebuilt from every request."""

from collections import deque

import numpy as np
import torch

from kvserve.engine.device_copy import to_device
from kvserve.engine.sampling_params import MAX_TOP_K, SamplingParams

TEMPERATURE, TOP_K, TOP_P, MIN_P, GREEDY = range(5)  # the columns of a row
ROW_CHUNK = 16  # the rows grow by this many at a time
TORCH_DTYPES = {np.float32: torch.float32, np.int64: torch.int64, np.bool_: torch.bool}


def param_row(params: SamplingParams) -> list[float]:
    """``params`` as a row: float64 holds each exactly (top-k up to ``MAX_TOP_K``; the
    float32 columns the sampler reads round from it as they would from the Python float).
    A greedy row's temperature is 1, so that dividing the batch by it leaves the row as
    it is; no top-k (0 or less) is ``MAX_TOP_K``, so that a row keeps ``min(top_k, vocab)``
    tokens."""
    greedy = params.greedy
    temperature = 1.0 if greedy else params.temperature
    top_k = params.top_k if params.top_k > 0 else MAX_TOP_K
    return [temperature, top_k, params.top_p, params.min_p, float(greedy)]


class ParamRows:
    """``host[row]``: the parameters (``param_row``) of the request holding ``row``, float64
    ``[rows, 5]``; on a device other than the CPU, ``on_device`` is a copy there (on the
    CPU, None: a step's columns come from its host gather, unless ``copy_on_cpu``, which
    runs the device path there).

    Rows are handed out (``take``) and given back on the engine thread (``SamplingState``
    does, with its slots), and ``host`` is written only there. A row's write reaches
    ``on_device`` where calls sample (the step thread under async scheduling), in the
    first call built after it (``StepParams.settle``): a row given back while a call in
    flight still reads its old owner's parameters is written for its new owner only after
    that read."""

    def __init__(self) -> None:
        self.host = np.zeros((0, 5), dtype=np.float64)
        self.on_device: torch.Tensor | None = None
        self.copy_on_cpu = False
        self._free: list[int] = []
        self._steps = 0  # sampling calls built
        self._pending: deque[tuple[int, int, np.ndarray]] = deque()  # (call, row, values)

    def take(self, params: SamplingParams) -> int:
        """A free row, set to ``params``."""
        if not self._free:
            have = self.host.shape[0]
            self.host = np.concatenate([self.host, np.zeros((ROW_CHUNK, 5))])
            self._free = list(range(have + ROW_CHUNK - 1, have - 1, -1))  # lowest first
        row = self._free.pop()
        self.host[row] = values = param_row(params)
        self._pending.append((self._steps, row, np.array(values)))
        return row

    def give_back(self, row: int) -> None:
        self._free.append(row)

    def step(self, rows: list[int], greedy: bool) -> "StepParams":
        """The columns of a sampling call of ``rows`` (taken before this call; ``greedy``:
        whether every one of them is greedy)."""
        self._steps += 1
        return StepParams(self, rows, self._steps, self.host[rows], greedy)

    def settle(self, device: torch.device, call: int) -> None:
        """Write to ``on_device`` the rows taken for the calls up to ``call`` (growing it to
        ``host``'s size first, keeping its rows); on the CPU without ``copy_on_cpu``, where
        there is no copy, forget them."""
        writes = []
        while self._pending and self._pending[0][0] < call:
            writes.append(self._pending.popleft())
        if device.type == "cpu" and not self.copy_on_cpu:
            return
        have = 0 if self.on_device is None else self.on_device.shape[0]
        if have < self.host.shape[0]:
            grown = torch.zeros(self.host.shape, dtype=torch.float64, device=device)
            if self.on_device is not None:
                grown[:have] = self.on_device
            self.on_device = grown
        assert self.on_device is not None
        if writes:
            rows = to_device([row for _, row, _ in writes], device, torch.long)
            values = to_device(np.stack([v for _, _, v in writes]), device)
            self.on_device.index_copy_(0, rows, values)

    def device_rows(self, index: torch.Tensor, call: int) -> torch.Tensor:
        """``on_device``'s rows at ``index``, settled for ``call`` first."""
        self.settle(index.device, call)
        assert self.on_device is not None
        return self.on_device.index_select(0, index)


class StepParams:
    """A sampling call's parameter columns: ``host``, its rows' parameters gathered on the
    engine thread when the call's rows were handed out (the call's own copy: later changes
    to the rows never reach it); which filters run is decided from it, with no device
    sync. ``column`` gives one on the device. ``greedy``: whether every row is greedy,
    known without reading ``host`` (a numpy reduction right after a forward costs several
    µs on a CPU whose caches the forward emptied)."""

    def __init__(
        self, table: ParamRows, rows: list[int], call: int, host: np.ndarray, greedy: bool
    ) -> None:
        self.table = table
        self.rows = rows
        self.call = call
        self.host = host
        self.greedy = greedy
        self._device: torch.Tensor | None = None

    def row(self, i: int) -> "StepParams":
        """Row ``i`` alone."""
        host = self.host[i : i + 1]
        return StepParams(self.table, [self.rows[i]], self.call, host, bool(host[0, GREEDY]))

    def settle(self, device: torch.device) -> None:
        """``ParamRows.settle`` for this call: every call runs it where it samples, so that
        rows' writes never pile up (on a CPU) or wait for a call that reads the columns."""
        self.table.settle(device, self.call)

    def column(self, which: int, dtype: type[np.generic], device: torch.device) -> torch.Tensor:
        """Column ``which`` of ``host`` as ``dtype`` on ``device``: on the CPU converted from
        ``host``; elsewhere gathered from ``ParamRows.on_device`` (one gather a call)."""
        if device.type == "cpu" and not self.table.copy_on_cpu:
            return torch.from_numpy(self.host[:, which].astype(dtype))
        if self._device is None:
            index = to_device(self.rows, device, torch.long)
            self._device = self.table.device_rows(index, self.call)
        return self._device[:, which].to(TORCH_DTYPES[dtype])
