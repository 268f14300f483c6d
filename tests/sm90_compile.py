"""Compile the Triton kernels for sm_90 (H100/H200) without a GPU and report the
assembler's register and spill counts.

    python tests/sm90_compile.py < JOBS.json   → one JSON report per job on stdout

A job is ``{"kernel": name in one of MODULES, "dtype": "bf16"|"fp16"|"fp32", "constants":
{...}, "num_warps": n}``, optionally with ``"pointers": {name: type}`` (pointer types past
INDEX_POINTERS, e.g. ``"*fp8e4nv"`` for an e4m3 KV cache's) and ``"aligned": [names]``: the
arguments a real launch sees as multiples of 16 (Triton specializes such ints and 16-byte-
aligned pointers; a GEMM compiled without it assumes K may be odd, loads one element at a time
and spills). It runs in a process of its own: Triton must not be in interpreter mode, which the
CPU test session turns on.
"""

import contextlib
import io
import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kvserve.engine.kernels import (
    triton_attention,
    triton_causal_conv1d,
    triton_delta_rule,
    triton_fp8_gemm,
    triton_fused,
    triton_lora,
    triton_w4a16,
)

HOPPER = GPUTarget("cuda", 90, 32)
MODULES = (
    triton_attention,
    triton_fused,
    triton_w4a16,
    triton_fp8_gemm,
    triton_delta_rule,
    triton_causal_conv1d,
    triton_lora,
)
INDEX_POINTERS = {
    "block_tables_ptr": "*i32",
    "query_start_loc_ptr": "*i32",
    "seq_lens_ptr": "*i32",
    "slot_mapping_ptr": "*i64",
    "positions_ptr": "*i64",
    "split_acc_ptr": "*fp32",
    "split_max_ptr": "*fp32",
    "split_sum_ptr": "*fp32",
    "sinks_ptr": "*fp32",
    "qweight_ptr": "*i32",
    "g_idx_ptr": "*i32",
    "a_scale_ptr": "*fp32",
    "b_scale_ptr": "*fp32",
}


def report(
    kernel: str,
    dtype: str,
    constants: dict,
    num_warps: int,
    pointers: dict[str, str] | None = None,
    aligned: tuple[str, ...] = (),
) -> dict[str, int]:
    """Tensors in ``dtype`` (``pointers`` name others' types), int32 strides and sizes, fp32
    scales, eps and soft-caps."""
    fn = next(getattr(module, kernel) for module in MODULES if hasattr(module, kernel))
    pointer_types = {**INDEX_POINTERS, **(pointers or {})}
    signature = {}
    for name in fn.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointer_types.get(name, f"*{dtype}")
        else:
            floats = name in ("eps", "softcap") or name.endswith("scale")
            signature[name] = "fp32" if floats else "i32"
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        source = ASTSource(fn, signature, constexprs=constants, attrs=attrs)
        triton.compile(source, target=HOPPER, options=dict(num_warps=num_warps))
    text = log.getvalue()
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    registers = re.search(r"Used (\d+) registers", text)
    if spills is None or registers is None:
        raise RuntimeError(f"no assembler report for {kernel}: {text!r}")
    return {
        "registers": int(registers[1]),
        "spill_stores": int(spills[1]),
        "spill_loads": int(spills[2]),
    }


def main() -> None:
    triton.knobs.compilation.always_compile = True
    triton.knobs.nvidia.dump_ptxas_log = True
    jobs = json.load(sys.stdin)
    json.dump([report(**job) for job in jobs], sys.stdout)


if __name__ == "__main__":
    main()
