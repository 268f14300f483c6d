"""benchmarks/lora_kernels.py on the CPU: its whole measurement under Triton's interpreter
(``--dry-run``: a tiny shape, no graphs), its accuracy check and its refusals (the timing
itself needs a GPU)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "lora_kernels", ROOT / "benchmarks" / "lora_kernels.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run is the CPU interpreter's")
def test_the_dry_run_measures_base_lora_and_both_and_writes_the_report(tmp_path, capsys):
    report = tmp_path / "lora.json"
    assert (
        bench.main(["--dry-run", "--batch", "7", "--adapters", "3", "--report", str(report)]) == 0
    )
    found = json.loads(report.read_text())
    assert found["device"] == "cpu" and found["shape"] == {
        "layers": 2,
        "hidden": 64,
        "q": 64,
        "kv": 16,
        "intermediate": 96,
    }
    assert (found["batch"], found["adapters"], found["rank"]) == (7, 3, 16)
    assert found["max_error"] <= bench.ACCURACY
    assert min(found["base_us"], found["lora_us"], found["both_us"]) > 0
    assert found["overhead"] == pytest.approx(found["both_us"] / found["base_us"] - 1)
    assert "7 rows, 3 adapters of rank 16, 2 layers" in capsys.readouterr().out


def test_the_accuracy_check_catches_a_wrong_slot():
    device = torch.device("cpu")
    shape = bench.DRY_RUN_SHAPE
    layer = bench.build(shape, 3, 8, device, torch.float32)[0]
    inputs = {name: torch.randn(5, k) for name, (k, _) in shape.projections().items()}
    from kvserve.engine.kernels.lora_segments import lora_segments

    row_slots = np.array([0, 2, 1, 1, 0], dtype=np.int32)
    segments = lora_segments(row_slots, device)
    assert bench.max_error(layer, inputs, row_slots, segments, 8) < 2**-18
    assert bench.max_error(layer, inputs, (row_slots + 1) % 3, segments, 8) > 0.1


def test_without_cuda_it_runs_nothing_and_refuses_bad_arguments(capsys):
    if not torch.cuda.is_available():
        assert bench.main([]) == 2
        assert capsys.readouterr().err == "lora_kernels: no CUDA device here; nothing was run\n"
    with pytest.raises(SystemExit):
        bench.main(["--dry-run"])
    assert "--dry-run needs --report" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--adapters", "9", "--batch", "8"])
    assert "--adapters at most --batch" in capsys.readouterr().err
