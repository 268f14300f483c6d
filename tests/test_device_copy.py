"""Host values onto the device: same values and dtypes as ``torch.tensor`` gives."""

import numpy as np
import pytest
import torch

from kvserve.engine.device_copy import to_device

DEVICES = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_to_device_keeps_values_and_types(device):
    cases = [
        (to_device([3, 1, 2], device, torch.int32), [3, 1, 2], torch.int32),
        (to_device(np.array([5, 6], dtype=np.int64), device), [5, 6], torch.int64),
        (to_device([0.5, 2.0], device), [0.5, 2.0], torch.float32),
        (to_device([True, False], device), [True, False], torch.bool),
        (to_device(torch.tensor([1.5, 2.5]), device, torch.bfloat16), [1.5, 2.5], torch.bfloat16),
    ]
    for tensor, values, dtype in cases:
        assert tensor.device.type == device.type
        assert tensor.dtype == dtype
        assert tensor.tolist() == values
    scalar = to_device(-torch.inf, device)
    assert (scalar.shape, scalar.item()) == ((), -torch.inf)
