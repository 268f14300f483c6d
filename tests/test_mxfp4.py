"""dequantize_mxfp4 on hand-made bytes: nibble order, the e2m1 table, the e8m0 scale per 32
features, and bad input named."""

import pytest
import torch

from kvserve.engine.kernels.mxfp4 import Mxfp4Weight, dequantize_mxfp4

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_each_code_low_nibble_first_times_two_to_the_scale_less_127():
    blocks = torch.zeros(1, 2, 2, 16, dtype=torch.uint8)  # E=1, N=2, K=64
    codes = torch.arange(32, dtype=torch.uint8) % 16  # row 0, features 0..31: 0..15, 0..15
    blocks[0, 0, 0] = codes[0::2] | (codes[1::2] << 4)
    blocks[0, 0, 1] = codes[0::2] | (codes[1::2] << 4)
    blocks[0, 1, 1, 15] = 0x9F  # row 1, features 62 (low nibble: 15 = -6) and 63 (9 = -0.5)
    scales = torch.tensor([[[127, 129], [0, 120]]], dtype=torch.uint8)
    dense = dequantize_mxfp4(blocks, scales)
    assert dense.shape == (1, 2, 64) and dense.dtype == torch.float32
    table = E2M1 + [-v for v in E2M1]
    assert dense[0, 0, :32].tolist() == table + table  # scale 2^0
    assert dense[0, 0, 32:].tolist() == [4 * v for v in table + table]  # scale 2^2
    expected_row_1 = [0.0] * 62 + [-6 * 2.0**-7, -0.5 * 2.0**-7]
    assert dense[0, 1].tolist() == expected_row_1
    assert torch.equal(dense[0, 1, :32], torch.zeros(32))  # scale 2^-127 of zeros


def test_the_weight_tuple_reports_its_dense_shape_and_keeps_a_dtype():
    weight = Mxfp4Weight(torch.zeros(3, 5, 4, 16, dtype=torch.uint8), torch.zeros(3, 5, 4).byte())
    assert weight.shape == (3, 5, 128)
    assert dequantize_mxfp4(*weight, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("blocks", "scales", "named"),
    [
        (torch.zeros(2, 4, 16, dtype=torch.int8), torch.zeros(2, 4, dtype=torch.uint8), "blocks"),
        (torch.zeros(2, 4, 8, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8), "blocks"),
        (torch.zeros(2, 4, 16, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8), "scales"),
        (torch.zeros(2, 4, 16, dtype=torch.uint8), torch.zeros(2, 4), "scales"),
    ],
)
def test_bad_layouts_are_named(blocks, scales, named):
    with pytest.raises(ValueError, match=f"^{named} must be"):
        dequantize_mxfp4(blocks, scales)
