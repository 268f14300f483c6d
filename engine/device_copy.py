"""Host values onto the device without waiting for the device."""

import torch


def to_device(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``data`` (a tensor, array or list of numbers on the host) as a ``dtype`` tensor on
    ``device``. A plain copy from pageable memory to a CUDA device synchronises the
    stream; staged in pinned memory, the copy is queued behind the work already
    submitted, so building a step's inputs never waits for kernels."""
    tensor = torch.as_tensor(data, dtype=dtype)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
