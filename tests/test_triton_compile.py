"""The kernels go through Triton's real compiler for an H100/H200 (sm_90), with the tile
shapes the launch picks, and fit in the registers: no spills. No GPU is needed: Triton's
wheel carries NVIDIA's assembler; tests/sm90_compile.py reads its report."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvserve.engine.attention.triton_backend import attention_launch, store_kv_constants

DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
SHAPES = {  # num_heads, num_kv_heads, head_dim
    "llama3-8b": (32, 8, 128),
    "qwen2-0.5b": (14, 2, 64),
}
CASES = [
    (model, dtype, phase)
    for model in SHAPES
    for dtype in DTYPES
    for phase in ("decode", "prefill")
    if dtype == torch.bfloat16 or model == "llama3-8b"
]


def job(model: str, dtype: torch.dtype, phase: str) -> dict:
    num_heads, num_kv_heads, head_dim = SHAPES[model]
    launch = attention_launch(8, num_heads, num_kv_heads, head_dim, 1 if phase == "decode" else 512)
    return {
        "kernel": "paged_attention_kernel",
        "dtype": DTYPES[dtype],
        "constants": launch.constants(16, dtype),
        "num_warps": launch.num_warps,
    }


@pytest.fixture(scope="module")
def reports() -> dict:
    jobs = [job(*case) for case in CASES]
    jobs.append(
        {
            "kernel": "store_kv_kernel",
            "dtype": "bf16",
            "constants": store_kv_constants(16, 8, 128),
            "num_warps": 4,
        }
    )
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
    return dict(zip([*CASES, "store_kv"], results, strict=True))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{DTYPES[c[1]]}-{c[2]}")
def test_attention_fits_in_registers(reports, case):
    assert reports[case]["spill_stores"] == reports[case]["spill_loads"] == 0, reports[case]


def test_store_kv_fits_in_registers(reports):
    assert reports["store_kv"]["spill_stores"] == reports["store_kv"]["spill_loads"] == 0
