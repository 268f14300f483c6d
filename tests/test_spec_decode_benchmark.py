"""benchmarks/spec_decode.py without starting a server: the command lines its dry run gives
kvserve and vLLM (the same speculative config, serving.py's shared flags), its refusals of
bad arguments, the error it reports for a server that exits at start, and its tables."""

import importlib
import json
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
         "prompt_lookup_max": 5}  # fmt: skip


@pytest.fixture
def spec_decode(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    yield importlib.import_module("spec_decode")
    for name in ("spec_decode", "serving", "server_launch", "gguf_export"):
        sys.modules.pop(name, None)


@pytest.fixture
def vllm_cli(tmp_path) -> Path:
    """An executable file standing where `--vllm` points (the dry run never starts it)."""
    path = tmp_path / "bin" / "vllm"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(0o755)
    return path


def test_the_dry_run_gives_both_servers_the_same_flags_and_speculative_config(
    spec_decode, vllm_cli, capsys
):
    spec_decode.main(["--dry-run", "--vllm", str(vllm_cli), "--num-speculative-tokens", "3"])
    lines = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    kvserve = str(sys.modules["server_launch"].KVSERVE)
    shared = ["--max-model-len", "2048", "--enable-prefix-caching", "--max-num-seqs", "16"]
    config = ["--speculative-config", json.dumps(NGRAM | {"num_speculative_tokens": 3})]
    kv_cache = ["--kv-cache-memory-gb", "2"]
    tail = ["--served-model-name", "m", "--host", "127.0.0.1", "--port", "0", "--dtype", "float32"]
    model = lines[0][3]
    assert lines[0] == [kvserve, "serve", "--model", model, *tail, *shared, *kv_cache]
    assert lines[1] == [str(vllm_cli), "serve", model, *tail, *shared]
    assert lines[2] == [kvserve, "serve", "--model", model, *tail, *shared, *config, *kv_cache]
    assert lines[3] == [str(vllm_cli), "serve", model, *tail, *shared, *config]


def test_without_vllm_the_dry_run_starts_kvserve_alone(spec_decode, capsys):
    spec_decode.main(["--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "--speculative-config" not in lines[0]
    assert shlex.split(lines[1])[-4:-2] == ["--speculative-config", json.dumps(NGRAM)]


@pytest.mark.parametrize(
    "argv, error",
    [
        (["--vllm", "/nonexistent/vllm"], "--vllm /nonexistent/vllm: not an executable file"),
        (["--num-speculative-tokens", "0"], "--num-speculative-tokens must be at least 1"),
        (["--single", "0"], "--single must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(spec_decode, capsys, argv, error):
    with pytest.raises(SystemExit) as exit_:
        spec_decode.parse_args(argv)
    assert exit_.value.code == 2
    assert error in capsys.readouterr().err


def test_a_server_that_exits_at_start_is_reported_with_the_error_it_ended_on(
    spec_decode, vllm_cli, tmp_path
):
    """The servers' log holds an earlier server's error too: the refusal is the last
    section's, without the process prefix vLLM puts before it."""
    vllm_cli.write_text(
        "#!/bin/sh\necho '(APIServer pid=7) Traceback (most recent call last):'\n"
        "echo '(APIServer pid=7) ValueError: ngram is not supported on CPU.'\n"
        "echo '(APIServer pid=7) shutting down'\nexit 1\n"
    )
    (tmp_path / "servers.log").write_text("\n=== kvserve\nKeyError: earlier\n")
    args = spec_decode.parse_args(["--vllm", str(vllm_cli)])
    rows, error, command = spec_decode.serve("vllm", True, tmp_path / "model", {}, args, tmp_path)
    assert (rows, error, command) == ([], "ValueError: ngram is not supported on CPU.", "")


def row(spec_decode, server: str, workload: str, on: bool, p50: float, p99: float, rate: float):
    return spec_decode.Row(server, workload, 1, on, (p50, p99), rate, 0.5 if on else None)


def test_the_tables_pair_off_with_on_and_kvserve_with_vllm(spec_decode):
    rows = [
        row(spec_decode, "kvserve", "code-edit", False, 100.0, 200.0, 10.0),
        row(spec_decode, "vllm", "code-edit", False, 80.0, 160.0, 12.5),
        row(spec_decode, "kvserve", "code-edit", True, 40.0, 180.0, 25.0),
        row(spec_decode, "vllm", "code-edit", True, 50.0, 90.0, 20.0),
    ]
    assert spec_decode.rows_table(rows)[2:] == [
        "| kvserve | code-edit | 1 | 100.0 / 40.0 | 0.40x | 200.0 / 180.0 | 10.0 / 25.0 | 50% |",
        "| vllm | code-edit | 1 | 80.0 / 50.0 | 0.62x | 160.0 / 90.0 | 12.5 / 20.0 | 50% |",
    ]
    assert spec_decode.ratio_table(rows)[2:] == [
        "| code-edit | 1 | 1.25x / 0.80x | 1.25x / 2.00x | 0.80x / 1.25x |"
    ]
    # vLLM refused speculation: its row shows off alone, the ratio's "on" half a dash
    assert spec_decode.rows_table(rows[:3])[3] == (
        "| vllm | code-edit | 1 | 80.0 / - | - | 160.0 / - | 12.5 / - | - |"
    )
    assert spec_decode.ratio_table(rows[:3])[2] == (
        "| code-edit | 1 | 1.25x / - | 1.25x / - | 0.80x / - |"
    )
