"""The kernels go through Triton's real compiler for an H100/H200 (sm_90), with the tile
shapes the launch picks, and fit in the registers: no spills. No GPU is needed: Triton's
wheel carries NVIDIA's assembler; tests/sm90_compile.py reads its report."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvserve.engine.kernels.triton_fp8_gemm import fp8_launch
from kvserve.engine.kernels.triton_fused import SILU_BLOCK
from kvserve.engine.kernels.triton_w4a16 import w4a16_launch
from kvserve.engine.layers.attention.kind import PLAIN, AttentionKind
from kvserve.engine.layers.attention.triton_backend import (
    MAX_SPLITS,
    attention_launch,
    store_kv_constants,
)

DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
SHAPES = {  # num_heads, num_kv_heads, head_dim
    "llama3-8b": (32, 8, 128),
    "qwen2-0.5b": (14, 2, 64),
}
FUSED = {  # the elementwise kernels at Llama-3-8B's shapes, as triton_fused launches them
    "rms_norm_kernel": (dict(HAS_RESIDUAL=True, BLOCK=4096), 8),
    "silu_and_mul_kernel": (dict(BLOCK=SILU_BLOCK), 4),
    "rope_kernel": (dict(Q_HEADS_PAD=32, K_HEADS_PAD=8, HALF=64, HALF_PAD=64), 4),
}
# What a launch at 4096 x 4096 sees as multiples of 16: the pointers, sizes and row strides.
W4A16_ALIGNED = [
    *("x_ptr", "qweight_ptr", "scales_ptr", "zeros_ptr", "g_idx_ptr", "bias_ptr", "out_ptr"),
    *("N", "K", "k_span", "stride_xm", "stride_qk", "stride_sg", "stride_om"),
]
FP8_ALIGNED = [
    *("a_ptr", "b_ptr", "a_scale_ptr", "b_scale_ptr", "bias_ptr", "out_ptr"),
    *("N", "K", "stride_am", "stride_bn", "stride_om"),
]
QUANTIZED = {  # the quantized GEMMs as their launches pick tiles at 4096 x 4096: rows, FP8 block
    "w4a16-decode": (1, None),
    "w4a16-prefill": (512, None),
    "fp8-decode": (1, None),
    "fp8-prefill": (512, None),
    "fp8-block-decode": (1, (128, 128)),
    "fp8-block-prefill": (512, (128, 128)),
    "fp8-block-prefill-fp16-dots": (512, (128, 128)),
}
CACHE_ELEMENTS = {"int32": 2**30, "int64": 2**32}  # the offsets each cache size takes
CASES = [
    (model, dtype, phase, offsets)
    for model in SHAPES
    for dtype in DTYPES
    for phase in ("decode", "prefill")
    for offsets in CACHE_ELEMENTS
    if (dtype == torch.bfloat16 or model == "llama3-8b")
    and (offsets == "int32" or (model, dtype) == ("llama3-8b", torch.bfloat16))
]


# An e4m3 KV cache (--kv-cache-dtype fp8) under bf16 activations, as TritonAttention launches
# it: dots upcast to fp32 (no native operands).
FP8_CASES = [("llama3-8b", phase) for phase in ("decode", "prefill")]
FP8_CACHE = {"key_cache_ptr": "*fp8e4nv", "value_cache_ptr": "*fp8e4nv"}
# Every attention kind at once (a sliding window, sinks, soft-capping; the flags are all the
# kernel sees of them), bf16 at Llama-3-8B's shapes.
ALL_KINDS = AttentionKind(128, torch.zeros(32), 50.0)
KIND_CASES = [("llama3-8b", phase, "kinds") for phase in ("decode", "prefill")]


def job(
    model: str,
    dtype: torch.dtype,
    phase: str,
    offsets: str,
    kv_fp8: bool = False,
    kind: AttentionKind = PLAIN,
) -> dict:
    num_heads, num_kv_heads, head_dim = SHAPES[model]
    launch = attention_launch(
        8, num_heads, num_kv_heads, head_dim, 1 if phase == "decode" else 512, dtype, kind.window
    )
    if kv_fp8:
        launch = dataclasses.replace(launch, native_dots=False)
    return {
        "kernel": "paged_attention_kernel",
        "dtype": DTYPES[dtype],
        "constants": launch.constants(16, dtype, CACHE_ELEMENTS[offsets], kv_fp8, kind),
        "num_warps": launch.num_warps,
        "pointers": FP8_CACHE if kv_fp8 else {},
    }


def quantized_job(name: str) -> dict:
    m, block = QUANTIZED[name]
    if name.startswith("w4a16"):
        launch = w4a16_launch(m, 4096, 4096)
        return {
            "kernel": "w4a16_gemm_kernel",
            "dtype": "bf16",
            "constants": dict(
                HAS_BIAS=False,
                NATIVE_DOTS=True,
                SPLIT_K=launch.split_k,
                BLOCK_M=launch.block_m,
                BLOCK_N=launch.block_n,
                BLOCK_K=launch.block_k,
            ),
            "num_warps": launch.num_warps,
            "pointers": {"out_ptr": "*fp32"} if launch.split_k > 1 else {},
            "aligned": W4A16_ALIGNED,
        }
    group_n, group_k = (1, 128) if block is None else block
    launch = fp8_launch(m, group_k)
    fp8_dots = not name.endswith("fp16-dots")
    operand = "*fp8e4nv" if fp8_dots else "*u8"
    return {
        "kernel": "fp8_gemm_kernel",
        "dtype": "bf16",
        "constants": dict(
            BLOCK_SCALES=block is not None,
            GROUP_N=group_n,
            GROUP_K=group_k,
            FP8_DOTS=fp8_dots,
            HAS_BIAS=False,
            BLOCK_M=launch.block_m,
            BLOCK_N=launch.block_n,
            BLOCK_K=launch.block_k,
        ),
        "num_warps": launch.num_warps,
        "pointers": {"a_ptr": operand, "b_ptr": operand},
        "aligned": FP8_ALIGNED,
    }


@pytest.fixture(scope="module")
def reports() -> dict:
    jobs = [job(*case) for case in CASES]
    jobs += [job(model, torch.bfloat16, phase, "int32", kv_fp8=True) for model, phase in FP8_CASES]
    jobs += [job(m, torch.bfloat16, phase, "int32", kind=ALL_KINDS) for m, phase, _ in KIND_CASES]
    jobs += [
        {
            "kernel": "store_kv_kernel",
            "dtype": "bf16",
            "constants": store_kv_constants(16, 8, 128, kv_fp8),
            "num_warps": 4,
            "pointers": FP8_CACHE if kv_fp8 else {},
        }
        for kv_fp8 in (False, True)
    ]
    jobs += [
        {"kernel": kernel, "dtype": "bf16", "constants": constants, "num_warps": warps}
        for kernel, (constants, warps) in FUSED.items()
    ]
    jobs.append(
        {
            "kernel": "merge_splits_kernel",
            "dtype": "bf16",
            "constants": dict(NUM_SPLITS=MAX_SPLITS, HEAD_DIM=128, HEAD_PAD=128),
            "num_warps": 4,
        }
    )
    jobs += [quantized_job(name) for name in QUANTIZED]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("sm90_compile.py")
    done = subprocess.run(
        [sys.executable, str(script)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    results = json.loads(done.stdout)
    names = [
        *CASES,
        *FP8_CASES,
        *KIND_CASES,
        "store_kv",
        "store_kv_fp8",
        *FUSED,
        "merge_splits",
        *QUANTIZED,
    ]
    return dict(zip(names, results, strict=True))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join((c[0], DTYPES[c[1]], *c[2:])))
def test_attention_fits_in_registers(reports, case):
    assert reports[case]["spill_stores"] == reports[case]["spill_loads"] == 0, reports[case]


@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "-".join(c))
def test_attention_over_an_fp8_cache_compiles_and_fits_in_registers(reports, case):
    assert reports[case]["spill_stores"] == reports[case]["spill_loads"] == 0, reports[case]


@pytest.mark.parametrize("case", KIND_CASES, ids=lambda c: "-".join(c))
def test_attention_of_every_kind_compiles_and_fits_in_registers(reports, case):
    assert reports[case]["spill_stores"] == reports[case]["spill_loads"] == 0, reports[case]


@pytest.mark.parametrize("name", ["store_kv", "store_kv_fp8"])
def test_store_kv_fits_in_registers(reports, name):
    assert reports[name]["spill_stores"] == reports[name]["spill_loads"] == 0


def test_merge_splits_fits_in_registers(reports):
    merge = reports["merge_splits"]
    assert merge["spill_stores"] == merge["spill_loads"] == 0, merge


@pytest.mark.parametrize("kernel", FUSED)
def test_fused_elementwise_kernels_fit_in_registers(reports, kernel):
    assert reports[kernel]["spill_stores"] == reports[kernel]["spill_loads"] == 0, reports[kernel]


@pytest.mark.parametrize("gemm", QUANTIZED)
def test_quantized_gemms_fit_in_registers(reports, gemm):
    assert reports[gemm]["spill_stores"] == reports[gemm]["spill_loads"] == 0, reports[gemm]
