"""The batched LoRA kernels go through Triton's real compiler for an H100/H200 (sm_90) with
the constants their wrappers launch with (tests/sm90_compile.py; no GPU needed), at
Llama-3-8B's decode (8 rows per adapter, the K loop split) and prefill (groups past 16 rows)
shapes, ranks 16 and 64, in bf16 and fp32: every one compiles and fits in the registers."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvserve.engine.kernels.triton_lora import BLOCK_K, BLOCK_N, launch_constants, shrink_split

POINTERS = {
    "rows_ptr": "*i32",
    "starts_ptr": "*i32",
    "lengths_ptr": "*i32",
    "slots_ptr": "*i32",
    "offsets_ptr": "*i32",
    "sizes_ptr": "*i32",
    "shrunk_ptr": "*fp32",
}
ALIGNED = ["x_ptr", "a_ptr", "b_ptr", "K", "stride_xm", "stride_as", "stride_ar", "stride_bs"]
CASES = [
    (phase, rank, dtype)
    for phase in ("decode", "prefill")
    for rank in (16, 64)
    for dtype in ("bf16", "fp32")
    if dtype == "bf16" or rank == 16
]


def jobs(phase: str, rank: int, dtype: str) -> list[dict]:
    max_length = 8 if phase == "decode" else 512
    constants = launch_constants(rank, max_length, native_dots=dtype == "bf16")
    split_k = shrink_split(4096, 3 * 8)[0] if phase == "decode" else 1  # q/k/v, 8 adapters
    shrink = {
        "kernel": "lora_shrink_kernel",
        "dtype": dtype,
        "constants": {**constants, "SPLIT_K": split_k, "BLOCK_K": BLOCK_K},
        "num_warps": 4,
        "pointers": {**POINTERS, "out_ptr": "*fp32"},
        "aligned": ALIGNED[:2] + ALIGNED[3:6],
    }
    expand = {
        "kernel": "lora_expand_kernel",
        "dtype": dtype,
        "constants": {**constants, "BLOCK_N": BLOCK_N},
        "num_warps": 4,
        "pointers": POINTERS,
        "aligned": ["b_ptr", "out_ptr", "stride_bs", "stride_om"],
    }
    return [shrink, expand]


@pytest.fixture(scope="module")
def reports() -> dict:
    batch = [job for case in CASES for job in jobs(*case)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sm90_compile.py"))],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    results = json.loads(done.stdout)
    names = [(*case, kernel) for case in CASES for kernel in ("shrink", "expand")]
    return dict(zip(names, results, strict=True))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("kernel", ["shrink", "expand"])
def test_lora_kernels_compile_for_sm90_and_fit_in_registers(reports, case, kernel):
    found = reports[(*case, kernel)]
    assert found["spill_stores"] == found["spill_loads"] == 0, found
