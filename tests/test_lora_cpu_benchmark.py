"""benchmarks/lora_cpu.py without vLLM: the spec its ``--vllm`` runs hand runners.py's
``vllm`` runner (kvserve's prompts and adapters), its table with vLLM's columns and a failed
vLLM run, and its refusals of bad arguments."""

import importlib
import sys
from pathlib import Path

import pytest

from kvserve import LoRARequest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def lora_cpu(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    yield importlib.import_module("lora_cpu")
    for name in ("lora_cpu", "throughput", "server_launch"):
        sys.modules.pop(name, None)


def test_each_vllm_run_gets_kvserves_prompts_and_adapters_in_the_same_turns(lora_cpu):
    workload = lora_cpu.Workload([[5, 6], [7], [8, 9, 10], [11], [12, 13]], max_tokens=3)
    adapters = [LoRARequest(f"a{i}", i, f"/adapters/a{i}") for i in range(1, 5)]
    runs = lora_cpu.runs(adapters)
    assert [(lora, loras) for _, lora, loras in runs] == [
        (False, [None]),
        (True, [None]),
        (True, [adapters[0], None]),
        (True, [*adapters, None]),
        (False, [None]),
    ]
    base = {
        "engine": "vllm",
        "model": "/m",
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "prompts": workload.prompts,
        "max_tokens": 3,
        "warmup_prompts": workload.prompts[:4],
    }
    assert lora_cpu.vllm_spec(Path("/m"), workload, False, [None]) == base
    assert lora_cpu.vllm_spec(Path("/m"), workload, True, runs[3][2]) == base | {
        "lora": {
            "max_loras": 4,
            "max_lora_rank": 16,
            "adapters": [[f"a{i}", i, f"/adapters/a{i}"] for i in range(1, 5)] + [None],
        }
    }


def test_the_table_puts_vllm_beside_kvserve_and_names_a_failed_run(lora_cpu):
    rows = [
        ("base", (10.0, 400), {"wall_s": 8.0, "output_tokens": 400}),
        ("4 adapters", (20.0, 400), {"error": "CalledProcessError", "message": "ValueError: x"}),
        ("1 adapter", (16.0, 400), {"wall_s": 10.0, "output_tokens": 400}),
    ]
    assert lora_cpu.table(rows)[2:] == [
        "| base | 10.0 | 40.0 | 1.00x | 8.0 | 50.0 | 1.00x | 0.80x |",
        "| 4 adapters | 20.0 | 20.0 | 0.50x | failed: CalledProcessError | - | - | - |",
        "| 1 adapter | 16.0 | 25.0 | 0.62x | 10.0 | 40.0 | 0.80x | 0.62x |",
    ]
    kvserve_alone = [(name, kvserve, None) for name, kvserve, _ in rows]
    assert lora_cpu.table(kvserve_alone)[0] == (
        "| run | kvserve W1 wall (s) | output tok/s | vs the base model alone |"
    )
    assert lora_cpu.table(kvserve_alone)[3] == "| 4 adapters | 20.0 | 20.0 | 0.50x |"


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--vllm", "/nonexistent/python"], "--vllm /nonexistent/python: not an executable file"),
        (["--requests", "0"], "--requests and --max-tokens must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(lora_cpu, capsys, argv, error):
    with pytest.raises(SystemExit) as exit_:
        lora_cpu.parse_args(argv)
    assert exit_.value.code == 2
    assert error in capsys.readouterr().err
