"""How 4-bit checkpoints pack eight values into each int32, undone into one byte per value
(0..15, unsigned). Value j of a word sits in bits 4j..4j+3 in every format; they differ in
which dimension the eight values run along and, for AWQ, in their order:

* GPTQ ``qweight`` [K / 8, N]: eight consecutive input features (rows) per word;
  ``qzeros`` [G, N / 8]: eight consecutive output features (columns) per word.
* AWQ ``qweight`` [K, N / 8] and ``qzeros`` [G, N / 8]: eight output features per word,
  interleaved: value j of a word is feature ``AWQ_ORDER[j]`` of its eight.
* compressed-tensors ``weight_packed`` [N, K / 8]: eight input features per word, signed
  values stored plus 8; asymmetric ``weight_zero_point`` [N / 8, G]: eight output features
  (rows) per word, also plus 8.
"""

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""Value j of an AWQ word is feature ``AWQ_ORDER[j]`` of the word's eight."""


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C] → uint8 [R, C, 8]: value j of each word at [..., j]."""
    if packed.dtype != torch.int32:
        raise ValueError(f"a packed 4-bit tensor is int32, not {packed.dtype}")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).to(torch.uint8)


def unpack_along_rows(packed: torch.Tensor) -> torch.Tensor:
    """[R, C] words of eight consecutive rows → uint8 [8R, C]."""
    values = _nibbles(packed)  # [R, C, 8]
    return values.permute(0, 2, 1).reshape(packed.shape[0] * 8, packed.shape[1])


def unpack_along_columns(
    packed: torch.Tensor, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """[R, C] words of eight consecutive columns → uint8 [R, 8C]; ``order``: value j of a
    word is column ``order[j]`` of its eight (None: j)."""
    values = _nibbles(packed)  # [R, C, 8]
    if order is not None:
        values = values[..., torch.tensor(order).argsort()]
    return values.reshape(packed.shape[0], packed.shape[1] * 8)
