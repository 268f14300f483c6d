"""benchmarks/gpu_check.py on the CPU: its arithmetic, its workload, and its measuring
harness run end to end on a tiny checkpoint that it writes itself."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine

from reference import assert_greedy_match, hf_greedy

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def test_help_and_refusal_without_cuda(capsys):
    with pytest.raises(SystemExit) as shown:
        gpu_check.parse_args(["--help"])
    assert shown.value.code == 0
    assert "--requests REQUESTS" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert gpu_check.main([]) == 2
        assert capsys.readouterr().err == "gpu_check: no CUDA device here; nothing was run\n"


def test_llama3_8b_facts():
    facts = gpu_check.ModelFacts.of(gpu_check.llama3_8b_config(), torch.bfloat16)
    assert facts.num_params == 8_030_261_248
    assert facts.embedding_params == facts.head_params == 128256 * 4096
    assert facts.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert facts.decode_weight_bytes == (8_030_261_248 - 525_336_576) * 2
    assert facts.token_matmul_params == 8_030_261_248 - 2 * 525_336_576


def test_floors():
    facts = gpu_check.ModelFacts(
        num_params=1000, embedding_params=100, head_params=100, kv_bytes_per_token=8, dtype_bytes=2
    )
    # (900 weights * 2 bytes + 50 tokens * 8 bytes) / 2 GB/s = 1.1 µs
    assert gpu_check.decode_floor_ms(facts, 50, 2.0) == pytest.approx(1.1e-3)
    # 1.6 TFLOP/s over 2 * 800 flops per token
    assert gpu_check.prefill_floor_tokens_per_s(facts, 1.6) == pytest.approx(1e9)


def test_workload_is_seeded_and_in_range():
    workload = gpu_check.Workload.random(50, 100, 1024, 128256, seed=3)
    assert workload == gpu_check.Workload.random(50, 100, 1024, 128256, seed=3)
    assert workload != gpu_check.Workload.random(50, 100, 1024, 128256, seed=4)
    assert all(100 <= len(p) <= 1024 for p in workload.prompts)
    assert all(100 <= n <= 1024 for n in workload.max_tokens)
    assert all(2 <= t < 128256 for p in workload.prompts for t in p)


def test_leading_agreement():
    ours = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    theirs = [[1, 2, 9], [4, 5], [0, 7, 8, 9]]
    assert gpu_check.leading_agreement(ours, theirs) == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert gpu_check.leading_agreement([[1, 2]], [[1, 2, 3, 4]]) == 0.5


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu-check-tiny")
    config = gpu_check.llama3_8b_config(**TINY)
    gpu_check.save_random_checkpoint(path, config, torch.float32, torch.device("cpu"))
    return path


@pytest.fixture
def engine(tiny_checkpoint):
    config = EngineConfig(
        model=str(tiny_checkpoint),
        dtype="float32",
        device="cpu",
        max_num_batched_tokens=64,
        num_kv_blocks=64,
    )
    return LLMEngine(config)


def test_decode_and_prefill_measurements(engine):
    decode = gpu_check.measure_decode(engine, batch=2, prompt_len=8, steps=3, seed=0)
    # both prompts prefill in one step and sample a token: 9, 10, 11 tokens each when timed
    assert decode["context_tokens"] == 20
    assert decode["step_ms"] > 0
    assert not engine.has_unfinished_requests()
    assert gpu_check.measure_prefill(engine, num=3, length=10, seed=0) > 0
    assert not engine.has_unfinished_requests()


def test_mixed_step_measurement(engine):
    """Both ways timed (the CPU's forward as built, then the model alone), the forward put
    back, every request done; no CUDA graphs on a CPU, so no bucket."""
    built = engine.runner.forward
    found = gpu_check.measure_mixed(engine, decodes=2, chunk=8, steps=2, seed=0)
    assert found["graphs_step_ms"] > 0 and found["eager_step_ms"] > 0
    assert found["bucket"] is None and (found["decodes"], found["chunk"]) == (2, 8)
    assert engine.runner.forward is built
    assert not engine.has_unfinished_requests()


def test_end_to_end_runners_give_greedy_outputs(engine, tiny_checkpoint):
    """Both runners return each request's own number of greedy tokens."""
    from transformers import AutoModelForCausalLM
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    workload = gpu_check.Workload.random(4, 3, 12, TINY["vocab_size"], seed=1)
    ours, wall = gpu_check.run_kvserve(engine, workload)
    assert wall > 0
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    cb_config = ContinuousBatchingConfig(page_size=16, num_blocks=16, max_batch_tokens=64)
    theirs, wall = gpu_check.run_transformers(model, workload, cb_config)
    assert wall > 0
    path = str(tiny_checkpoint)
    for prompt, n, a, b in zip(workload.prompts, workload.max_tokens, ours, theirs, strict=True):
        expected = hf_greedy(path, prompt, n)
        assert_greedy_match(path, prompt, expected, a)
        assert_greedy_match(path, prompt, expected, b)
    assert gpu_check.leading_agreement(ours, theirs) == 1.0


def test_profile_decode(engine):
    found = gpu_check.profile_decode(engine, batch=2, prompt_len=8, steps=3, seed=0)
    assert not engine.has_unfinished_requests()
    assert found["step_ms"] > 0
    host = dict(found["top_host_ms"])
    assert len(host) == 15 and all(ms >= 0 for ms in host.values())
    assert any(name.startswith("aten::") for name in host)
    if not torch.cuda.is_available():
        assert found["device_busy_ms"] == 0


def test_partings_judged_in_fp32(tiny_checkpoint):
    """A greedy output and one changed at its third token part there: the fp32 judge ranks
    the greedy token first, the changed one lower, by the logits' own difference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    workload = gpu_check.Workload.random(2, 4, 8, TINY["vocab_size"], seed=2)
    reference = [hf_greedy(str(tiny_checkpoint), p, 6) for p in workload.prompts]
    first = reference[0]
    changed = [[*first[:2], (first[2] + 1) % TINY["vocab_size"], *first[3:]]]
    found = gpu_check.partings(model, workload, changed + reference[1:], reference, limit=5)
    assert len(found) == 1
    (parting,) = found
    assert parting["at"] == 2 and parting["reference_rank"] == 1 and parting["ours_rank"] > 1
    with torch.inference_mode():
        context = torch.tensor([workload.prompts[0] + reference[0][:2]])
        logits = model(context).logits[0, -1]
    expected = logits[first[2]] - logits[changed[0][2]]
    assert parting["margin"] == pytest.approx(float(expected))
    assert parting["margin"] > 0 and parting["top2_gap"] >= 0
    assert gpu_check.partings(model, workload, reference, reference, limit=5) == []


def test_kernel_comparisons_run_their_kernels(monkeypatch):
    """measure_kernels (on the CPU where no GPU is), each call run once in place of the
    CUDA-graph timing: every attention shape and elementwise pair is called with arguments
    its kernels take."""
    called = []

    def run_once(fn):
        called.append(fn.func.__name__)
        fn()
        return 1.0

    monkeypatch.setattr(gpu_check, "graph_us", run_once)
    config = gpu_check.llama3_8b_config(**TINY)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    found = gpu_check.measure_kernels(config, device, bandwidth_gbs=1.0)
    assert set(found["attention"]) == {"1x528", "1x4096", "16x528", "64x528"}
    # 2 kv heads: 1 sequence splits 32 ways, 16 sequences 16 ways, 64 sequences 4 ways
    assert [a["splits"] for a in found["attention"].values()] == [32, 32, 16, 4]
    assert found["attention"]["1x528"]["floor_us"] == 2 * 528 * 2 * 16 * 2 / 1e3
    assert called.count("paged_attention") == 8
    assert sorted(found["elementwise"][64]) == ["add_rms_norm", "rope", "silu_and_mul"]
    assert called.count("rms_norm") == called.count("rms_norm_reference") == 2


def test_prefill_attention_matches_sdpa_on_the_same_shapes():
    config = gpu_check.llama3_8b_config(**TINY)
    found = gpu_check.prefill_attention_vs_sdpa(config, 40, torch.device("cpu"), torch.float32)
    assert found["tokens"] == 40 and found["triton_ms"] > 0 and found["sdpa_ms"] > 0
    assert found["max_abs_difference"] < 1e-5


def test_tiny_run_writes_every_stage(tmp_path):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--tiny", "--out", str(out), "--workdir", str(tmp_path / "m")]) == 0
    report = json.loads(out.read_text())
    stages = ["device", "checkpoint", "engine", "decode", "prefill", "mixed", "e2e"]
    if torch.cuda.is_available():
        stages = ["device", "kernels", *stages[1:], "syncs"]
    assert report["stages_done"] == stages
    assert list(report["decode"]) == ["1", "4"]
    for step in report["decode"].values():
        assert step["step_ms"] > 0 and 0 <= step["busy_share"] <= 1
    assert report["prefill"]["attention"]["tokens"] == 64
    assert report["prefill"]["attention"]["max_abs_difference"] < 1e-4
    assert report["e2e"]["async_tokens_per_s"] > 0 and report["e2e"]["sync_tokens_per_s"] > 0
    assert report["batch_limits"] == ([256, 8192] if torch.cuda.is_available() else [64, 2048])


def test_a_run_cut_off_keeps_the_stages_it_finished(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("cut off")

    monkeypatch.setattr(gpu_check, "measure_prefill", broken)
    out = tmp_path / "check.json"
    with pytest.raises(RuntimeError, match="cut off"):
        gpu_check.main(["--tiny", "--out", str(out), "--workdir", str(tmp_path / "m")])
    report = json.loads(out.read_text())
    assert report["stages_done"][-2:] == ["engine", "decode"]
    assert "prefill" not in report and report["decode"]["4"]["step_ms"] > 0
