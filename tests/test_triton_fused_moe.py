"""fused_moe on the GPU or in Triton's interpreter (tests/conftest.py) against a plain
per-expert float64 MoE (tests/moe_reference.py) on the same inputs, already rounded to the
tested dtype.

Tolerances, per output element: ``|got - ref| <= rtol * |ref| + atol * max|ref|``. float32:
rtol = atol = 2^-16 (summation order only). bfloat16: the kernel rounds the activation
``[T * K, I]`` and the output to bf16 once each (2^-8 relative, the interpreter's casts
truncate: 2^-7), products in fp32: rtol 2^-6, atol 2^-6. Measured worst in the interpreter:
2^-7.4 of max|ref| in bf16, 2^-21.8 in fp32.
"""

import pytest
import torch

from kvserve.engine.kernels.fused_moe_config import MoeTile
from kvserve.engine.kernels.mxfp4 import Mxfp4Weight, dequantize_mxfp4
from kvserve.engine.kernels.triton_fused_moe import fused_moe

from moe_reference import reference_moe, uneven_routing

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCES = {torch.float32: (2**-16, 2**-16), torch.bfloat16: (2**-6, 2**-6)}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
SMALL_TILE = MoeTile(16, 16, 16, num_warps=2, num_stages=1)  # several N tiles and K steps
EXPERTS, HIDDEN, INTER = 6, 40, 24  # neither 40 nor 24 a multiple of the 16-wide tiles


def moe_inputs(tokens, top_k, dtype, biases, seed, experts=EXPERTS, hidden=HIDDEN, inter=INTER):
    """Weights scaled so the activations stay near 1 (the swigluoai clamps then bite on
    some), and an uneven routing (``uneven_routing``)."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=generator)).to(dtype)

    return dict(
        hidden=randn(tokens, hidden, scale=2.0),
        w13=randn(experts, 2 * inter, hidden, scale=hidden**-0.5 * 2),
        w2=randn(experts, hidden, inter, scale=inter**-0.5),
        topk_weights=torch.rand(tokens, top_k, generator=generator),
        topk_ids=uneven_routing(tokens, top_k, experts, seed),
        w13_bias=randn(experts, 2 * inter) if biases else None,
        w2_bias=randn(experts, hidden) if biases else None,
    )


def on_device(inputs: dict) -> dict:
    return {name: None if t is None else t.to(DEVICE) for name, t in inputs.items()}


def assert_matches(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    rtol, atol = TOLERANCES[dtype]
    assert got.dtype == dtype and got.shape == ref.shape
    error = (got.double().cpu() - ref).abs()
    bound = rtol * ref.abs() + atol * ref.abs().max()
    assert (error <= bound).all(), f"worst excess {(error - bound).max().item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
@pytest.mark.parametrize("biases", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(
    ("tokens", "top_k"),
    [(1, 1), (1, 4), (5, 2), (70, 3)],
    ids=["decode-k1", "decode-k4", "t5-k2", "t70-k3"],
)
def test_matches_the_per_expert_reference(dtype, activation, biases, tokens, top_k):
    """Expert 0 gets no token and expert 1 all of them; T = 70 is many blocks per expert."""
    inputs = moe_inputs(tokens, top_k, dtype, biases, seed=tokens * 10 + top_k)
    ref = reference_moe(**inputs, activation=activation)
    got = fused_moe(**on_device(inputs), activation=activation, tile=SMALL_TILE)
    assert_matches(got, ref, dtype)


@pytest.mark.parametrize("tokens", [1, 300])
def test_the_configured_tiles_match_too(tokens):
    """No tile passed: the config loader's pick (the default here: 16-row blocks for a
    decode batch, 64-row for T = 300)."""
    inputs = moe_inputs(tokens, 2, torch.float32, True, seed=tokens, hidden=64, inter=32)
    ref = reference_moe(**inputs)
    assert_matches(fused_moe(**on_device(inputs)), ref, torch.float32)


def test_sharding_the_intermediate_size_splits_the_sum():
    """Two ranks' halves of I (gate and up rows sliced alike, w2's inputs sliced), w2_bias
    on rank 0 only: their sum is the whole."""
    inputs = on_device(moe_inputs(9, 3, torch.float32, True, seed=3))
    half = INTER // 2
    whole = fused_moe(**inputs, activation="swigluoai", tile=SMALL_TILE)
    parts = []
    for rank, rows in enumerate((slice(0, half), slice(half, INTER))):
        up_rows = slice(INTER + rows.start, INTER + rows.stop)
        shard = dict(inputs)
        shard["w13"] = torch.cat((inputs["w13"][:, rows], inputs["w13"][:, up_rows]), dim=1)
        shard["w13_bias"] = torch.cat(
            (inputs["w13_bias"][:, rows], inputs["w13_bias"][:, up_rows]), dim=1
        )
        shard["w2"] = inputs["w2"][:, :, rows]
        shard["w2_bias"] = inputs["w2_bias"] if rank == 0 else None
        parts.append(fused_moe(**shard, activation="swigluoai", tile=SMALL_TILE))
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=2**-18, atol=2**-18)
    assert not torch.allclose(parts[0], whole, atol=0.1)  # each half alone is not the whole


def test_no_tokens_give_an_empty_result():
    inputs = on_device(moe_inputs(0, 2, torch.bfloat16, False, seed=0))
    got = fused_moe(**inputs)
    assert got.shape == (0, HIDDEN) and got.dtype == torch.bfloat16


def bad(name: str, value):
    inputs = moe_inputs(3, 2, torch.float32, True, seed=1)
    inputs[name] = value(inputs) if callable(value) else value
    return inputs


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (bad("hidden", lambda i: i["hidden"].double()), "hidden must be"),
        (bad("hidden", lambda i: i["hidden"][0]), "hidden must be"),
        (bad("w13", lambda i: i["w13"].bfloat16()), "w13 must be"),
        (bad("w13", lambda i: i["w13"][:, :-1]), r"w13 must be \[E, 2I, 40\]"),
        (bad("w2", lambda i: i["w2"][:-1]), r"w13 must be \[E, 2I, 40\] and w2"),
        (bad("topk_ids", lambda i: i["topk_ids"].long()), "topk_ids must be int32"),
        (bad("topk_ids", lambda i: i["topk_ids"][:2]), "topk_ids must be int32"),
        (bad("topk_weights", lambda i: i["topk_weights"].half()), "topk_weights must be"),
        (bad("topk_weights", lambda i: i["topk_weights"][:, :1]), "topk_weights must be"),
        (bad("w13_bias", lambda i: i["w13_bias"][:, :INTER]), "w13_bias must be"),
        (bad("w2_bias", lambda i: i["w2_bias"].int()), "w2_bias must be"),
    ],
)
def test_bad_arguments_are_named(inputs, message):
    with pytest.raises(ValueError, match=message):
        fused_moe(**inputs)


def test_bad_activation_and_too_many_choices_are_named():
    inputs = moe_inputs(2, 2, torch.float32, False, seed=2)
    with pytest.raises(ValueError, match="activation must be one of"):
        fused_moe(**inputs, activation="gelu")  # type: ignore[arg-type]
    inputs["topk_ids"] = torch.zeros(2, EXPERTS + 1, dtype=torch.int32)
    inputs["topk_weights"] = torch.zeros(2, EXPERTS + 1)
    with pytest.raises(ValueError, match="topk_ids' K must be"):
        fused_moe(**inputs)


def random_mxfp4(experts: int, rows: int, features: int, generator) -> Mxfp4Weight:
    """Random codes (RMS about 3) times scales 2^-7 .. 2^-4: weights about the size of the
    dense ones above, so the activations stay mostly inside the clamps."""
    groups = features // 32
    blocks = torch.randint(0, 256, (experts, rows, groups, 16), generator=generator)
    scales = torch.randint(120, 124, (experts, rows, groups), generator=generator)
    return Mxfp4Weight(blocks.to(torch.uint8), scales.to(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "top_k"), [(1, 4), (33, 2)], ids=["decode", "t33"])
def test_mxfp4_experts_match_the_dense_kernel_on_their_dequantized_weights(dtype, tokens, top_k):
    """gpt-oss's layout decoded in the GEMMs' loop: the same result as the dense weights
    that ``dequantize_mxfp4`` gives (e2m1 times a power of two is exact in bf16, so only
    the summation may differ), and as the float64 reference."""
    hidden, inter = 64, 32
    generator = torch.Generator().manual_seed(tokens)
    inputs = moe_inputs(tokens, top_k, dtype, True, seed=tokens, hidden=hidden, inter=inter)
    w13 = random_mxfp4(EXPERTS, 2 * inter, hidden, generator)
    w2 = random_mxfp4(EXPERTS, hidden, inter, generator)
    inputs["w13"] = dequantize_mxfp4(*w13, dtype=dtype)
    inputs["w2"] = dequantize_mxfp4(*w2, dtype=dtype)
    dense = fused_moe(**on_device(inputs), activation="swigluoai", tile=SMALL_TILE)
    quantized = on_device(inputs) | {
        "w13": Mxfp4Weight(*(t.to(DEVICE) for t in w13)),
        "w2": Mxfp4Weight(*(t.to(DEVICE) for t in w2)),
    }
    got = fused_moe(**quantized, activation="swigluoai", tile=SMALL_TILE)
    rtol, atol = TOLERANCES[torch.float32]
    torch.testing.assert_close(got.float(), dense.float(), rtol=rtol, atol=atol)
    assert_matches(got, reference_moe(**inputs, activation="swigluoai"), dtype)


def test_bad_mxfp4_weights_are_named():
    inputs = moe_inputs(3, 2, torch.bfloat16, False, seed=4, hidden=64, inter=32)
    w13 = random_mxfp4(EXPERTS, 64, 64, torch.Generator().manual_seed(0))
    inputs["w13"] = Mxfp4Weight(w13.blocks, w13.scales[..., :1])
    with pytest.raises(ValueError, match=r"^w13: scales must be"):
        fused_moe(**inputs)
    inputs["w13"] = Mxfp4Weight(w13.blocks[0], w13.scales[0])
    with pytest.raises(ValueError, match=r"^w13.blocks must be \[E, N, K/32, 16\]"):
        fused_moe(**inputs)
