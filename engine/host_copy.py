"""Device → host copies of a step's results: every one the engine makes goes through
``to_host``, which counts them, so a test holds a step to its one sync (the sampled tokens
with their log-probabilities, packed in one tensor). Not counted: the tensor-parallel
executor's copies of a step's inputs for its workers, and the MoE layer's expert counts in
its torch path."""

import torch


class HostCopies:
    """How many device → host copies ``to_host`` made since the process started."""

    count = 0


def to_host(tensor: torch.Tensor) -> list:
    """``tensor``'s values as (nested) Python numbers: one device → host copy, counted."""
    HostCopies.count += 1
    return tensor.tolist()
