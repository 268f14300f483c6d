"""benchmarks/delta_rule_kernels.py on the CPU: ``--dry-run`` runs each kind of case under
Triton's interpreter (tests/conftest.py) and each kernel agrees with the torch path within
bf16's rounding of its output (the interpreter's bf16 casts truncate: 2^-7 relative; bound
2^-6 of the largest output); the shape is Qwen3.5-9B's."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "delta_rule_kernels", ROOT / "benchmarks" / "delta_rule_kernels.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_shape_is_qwen3_5_9b():
    shape = bench.qwen3_5_9b()
    assert (shape.num_k_heads, shape.num_v_heads) == (16, 32)
    assert (shape.head_k_dim, shape.head_v_dim, shape.conv_kernel) == (128, 128, 4)
    assert shape.conv_dim == 8192
    assert shape.state_bytes == 32 * 128 * 128 * 4 + 8192 * 3 * 2


def test_the_least_bytes_count_every_activation_and_each_state_twice():
    shape = bench.Shape(1, 2, 4, 8, 4)
    # q, k: 2 * 3 tokens * 4 * 2 B; v, o: 2 * 3 * 16 * 2 B; g, beta: 2 * 3 * 2 * 4 B;
    # states: 2 * 2 seqs * 2 * 4 * 8 * 4 B
    assert bench.delta_rule_bytes(shape, 3, 2) == 48 + 192 + 48 + 1024


def test_dry_run_runs_each_kernel_and_agrees_with_the_torch_path(tmp_path):
    out = tmp_path / "dry.json"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["dry_run"] and found["copy_bandwidth_gbs"] is None
    kernels = [(case["kernel"], case["phase"]) for case in found["cases"]]
    assert kernels == [
        ("delta_rule_step", "decode"),
        ("causal_conv1d_step", "decode"),
        ("chunked_delta_rule", "prefill"),
        ("causal_conv1d", "prefill"),
    ]
    for case in found["cases"]:
        assert case["max_relative_error"] < 2**-6, case
        assert "us" not in case
