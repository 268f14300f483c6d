"""Device → host copies of a step's results: every one the engine makes goes through
``to_host``, which counts them, so a test holds a step to its one sync (the sampled tokens
with their log-probabilities and the step's prompt log-probabilities, packed in one tensor:
``to_host_packed``). Not counted: the tensor-parallel
executor's copies of a step's inputs for its workers, and the MoE layer's expert counts in
its torch path."""

from collections.abc import Sequence

import torch


class HostCopies:
    """How many device → host copies ``to_host`` made since the process started."""

    count = 0


def to_host(tensor: torch.Tensor) -> list:
    """``tensor``'s values as (nested) Python numbers: one device → host copy, counted."""
    HostCopies.count += 1
    return tensor.tolist()


def to_host_packed(tables: Sequence[torch.Tensor]) -> list[list[list[float]]]:
    """The rows of several 2-D tensors in one ``to_host`` copy, as float64 (exact for float32
    values and for integers below 2**53): flattened into one tensor, cut back on the host."""
    flat = to_host(torch.cat([t.double().flatten() for t in tables]))
    host, start = [], 0
    for table in tables:
        rows, width = table.shape
        host.append([flat[start + r * width : start + (r + 1) * width] for r in range(rows)])
        start += rows * width
    return host
