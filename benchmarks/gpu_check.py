"""The GPU check: the kernel tests on the GPU, then a random-weight Llama-3-8B in bf16.

    python benchmarks/gpu_check.py [--out FILE] [--requests 256] [--layers N] ...

Needs a CUDA device. Steps, each recorded in the JSON written to --out:
1. The kernel, CUDA-graph, KV-sizing and device-copy tests (KERNEL_TESTS) on the GPU:
   compiled kernels, not the interpreter; graphs captured; syncs per decode step counted.
2. The device's copy bandwidth and bf16 matmul rate, measured here.
3. A random-weight checkpoint of Llama-3-8B's shape (bf16) written to --workdir.
4. kvserve on it: (a) decode step time at each --batches size against the floor
   (weights + KV bytes read) / copy bandwidth, and device syncs per decode step;
   (b) prefill throughput against 2 * matmul params * tokens / matmul rate;
   (c) end-to-end output tokens/s on --requests requests, prompt and output lengths
   uniform in [--min-len, --max-len], greedy, EOS ignored.
5. transformers' continuous batching (the engine behind ``generate_batch``) on the same
   checkpoint and workload, in this run.
"""

import argparse
import gc
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
KERNEL_TESTS = [
    "tests/test_triton_attention.py",
    "tests/test_cuda_graphs.py",
    "tests/test_kv_cache_sizing.py",
    "tests/test_device_copy.py",
]
LLAMA3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=0,
    pad_token_id=0,
)
EOS_TOKEN = "<|endoftext|>"


def llama3_8b_config(**overrides) -> LlamaConfig:
    return LlamaConfig(**{**LLAMA3_8B, **overrides})


@dataclass(frozen=True)
class ModelFacts:
    """Parameter counts of a Llama checkpoint and the bytes a decode step reads."""

    num_params: int
    embedding_params: int
    head_params: int
    kv_bytes_per_token: int
    dtype_bytes: int

    @classmethod
    def of(cls, config: LlamaConfig, dtype: torch.dtype) -> "ModelFacts":
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        head_dim = config.hidden_size // config.num_attention_heads
        kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
        return cls(
            num_params=sum(p.numel() for p in model.parameters()),
            embedding_params=model.get_input_embeddings().weight.numel(),
            head_params=model.get_output_embeddings().weight.numel(),
            kv_bytes_per_token=kv_per_token * dtype.itemsize,
            dtype_bytes=dtype.itemsize,
        )

    @property
    def decode_weight_bytes(self) -> int:
        """Every weight but the embedding table (of which a step reads a few rows)."""
        return (self.num_params - self.embedding_params) * self.dtype_bytes

    @property
    def token_matmul_params(self) -> int:
        """Weights every prompt token is multiplied through (not the LM head: only the
        last token of a prompt reaches it)."""
        return self.num_params - self.embedding_params - self.head_params


def decode_floor_ms(facts: ModelFacts, context_tokens: int, bandwidth_gbs: float) -> float:
    """A decode step must read every weight once and the KV of every context token."""
    nbytes = facts.decode_weight_bytes + context_tokens * facts.kv_bytes_per_token
    return nbytes / (bandwidth_gbs * 1e9) * 1e3


def prefill_floor_tokens_per_s(facts: ModelFacts, tflops: float) -> float:
    """Prompt tokens per second if the matmuls ran at the measured rate (attention's own
    products left out)."""
    return tflops * 1e12 / (2 * facts.token_matmul_params)


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    @classmethod
    def random(cls, n: int, min_len: int, max_len: int, vocab: int, seed: int) -> "Workload":
        """Prompt and output lengths uniform in [min_len, max_len]; ids avoid 0 and 1 (the
        checkpoint's EOS and BOS)."""
        rng = random.Random(seed)
        prompts = [
            [rng.randrange(2, vocab) for _ in range(rng.randint(min_len, max_len))]
            for _ in range(n)
        ]
        return cls(prompts, [rng.randint(min_len, max_len) for _ in range(n)])


def save_random_checkpoint(directory: Path, config: LlamaConfig, dtype, device) -> None:
    """Random weights (normal, std 0.02; norms at 1) initialised on ``device``, saved as
    safetensors with a word-level tokenizer in which every id decodes."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0, 0.02)
    model.save_pretrained(directory)
    vocab = {EOS_TOKEN: 0, "<s>": 1} | {f"w{i}": i for i in range(2, config.vocab_size)}
    backend = Tokenizer(WordLevel(vocab, unk_token=EOS_TOKEN))
    backend.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=EOS_TOKEN, bos_token="<s>", pad_token=EOS_TOKEN
    ).save_pretrained(directory)


def _best_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 2**31, repeats: int = 10) -> float:
    """Best bytes read + written per second copying one ``nbytes`` buffer into another."""
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_seconds(lambda: dst.copy_(src), device, repeats) / 1e9


def matmul_tflops(device: torch.device, n: int = 8192, repeats: int = 10) -> float:
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    return 2 * n**3 / _best_seconds(lambda: torch.mm(a, b), device, repeats) / 1e12


def _drain(engine) -> dict[str, list[int]]:
    """Step until idle; each request's output tokens (the engine's deltas, joined)."""
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    return outputs


def measure_decode(engine, batch: int, prompt_len: int, steps: int, seed: int) -> dict:
    """Median ``engine.step()`` time of ``batch`` requests all decoding, and the mean
    number of context tokens a timed step reads."""
    from kvserve import SamplingParams

    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=prompt_len + steps, ignore_eos=True)
    requests = [
        engine.add_request(
            f"decode-{batch}-{i}", [rng.randrange(2, vocab) for _ in range(prompt_len)], params
        )
        for i in range(batch)
    ]
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in requests):
        engine.step()
    times, contexts = [], []
    for _ in range(steps):
        contexts.append(sum(r.num_tokens for r in requests))
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    for request in requests:
        engine.abort_request(request.request_id)
    return {"step_ms": statistics.median(times) * 1e3, "context_tokens": statistics.mean(contexts)}


def count_decode_syncs(engine, batch: int, steps: int) -> float:
    """Device synchronisations per decode step, as torch's sync debug mode reports them."""
    from kvserve import SamplingParams

    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=steps + 8, ignore_eos=True)
    requests = [engine.add_request(f"sync-{i}", [5] * 64, params) for i in range(batch)]
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in requests):
        engine.step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for request in requests:
        engine.abort_request(request.request_id)
    # not torch's once-per-process notice that the debug mode is a prototype
    syncs = [w for w in caught if str(w.message).startswith("called a synchronizing")]
    return len(syncs) / steps


def measure_prefill(engine, num: int, length: int, seed: int) -> float:
    """Prompt tokens per second over ``num`` fresh prompts of ``length`` tokens."""
    from kvserve import SamplingParams

    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for i in range(num):
        prompt = [rng.randrange(2, vocab) for _ in range(length)]
        engine.add_request(f"prefill-{i}", prompt, params)
    start = time.perf_counter()
    _drain(engine)
    return num * length / (time.perf_counter() - start)


def leading_agreement(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """The mean share of each reference output that ``outputs`` repeats before the first
    token they differ in. Random weights leave near-ties in the logits, so greedy outputs
    in bf16 part within a long output; this says how far they agree first."""

    def agreeing(ours: list[int], theirs: list[int]) -> int:
        pairs = zip(ours, theirs, strict=False)
        return sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))

    return statistics.mean(
        agreeing(ours, theirs) / len(theirs)
        for ours, theirs in zip(outputs, reference, strict=True)
    )


def run_kvserve(engine, workload: Workload) -> tuple[list[list[int]], float]:
    from kvserve import SamplingParams

    start = time.perf_counter()
    for i, (prompt, n) in enumerate(zip(workload.prompts, workload.max_tokens, strict=True)):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        engine.add_request(f"e2e-{i}", prompt, params)
    outputs = _drain(engine)
    wall = time.perf_counter() - start
    return [outputs[f"e2e-{i}"] for i in range(len(workload.prompts))], wall


def run_transformers(model, workload: Workload, cb_config=None) -> tuple[list[list[int]], float]:
    """transformers' continuous batching, as ``generate_batch`` drives it, with each
    request's own output length."""
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    config = GenerationConfig(
        do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=max(workload.max_tokens)
    )
    hints = WorkloadHints(
        max_prompt_length=max(len(p) for p in workload.prompts),
        max_generated_length=max(workload.max_tokens),
        num_requests=len(workload.prompts),
    )
    results = {}
    with model.continuous_batching_context_manager(
        generation_config=config, continuous_batching_config=cb_config, workload_hints=hints
    ) as manager:
        start = time.perf_counter()
        for i, (prompt, n) in enumerate(zip(workload.prompts, workload.max_tokens, strict=True)):
            manager.add_request(prompt, request_id=str(i), max_new_tokens=n)
        while len(results) < len(workload.prompts):
            result = manager.get_result(timeout=1)
            if result is None and not manager.is_running():
                raise RuntimeError("transformers' batching loop stopped")
            if result is not None and result.is_finished():
                results[result.request_id] = list(result.generated_tokens)
        wall = time.perf_counter() - start
    return [results[str(i)] for i in range(len(workload.prompts))], wall


def run_kernel_tests() -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return {"returncode": proc.returncode, "tail": proc.stdout[-3000:] + proc.stderr[-2000:]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check.json")
    p.add_argument("--workdir", type=Path, help="where the checkpoint goes (default: a temp dir)")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--layers", type=int, default=32, help="fewer layers: a quicker, smaller run")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument(
        "--decode-prompt", type=int, default=512, help="prompt length when timing decode"
    )
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--prefill-prompts", type=int, default=16)
    p.add_argument("--prefill-len", type=int, default=1024)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing was run", file=sys.stderr)
        return 2
    from kvserve.engine.config import EngineConfig
    from kvserve.engine.llm_engine import LLMEngine

    device = torch.device("cuda")
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    import triton

    report: dict = {
        "device": torch.cuda.get_device_name(device),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "transformers": transformers.__version__,
        },
        "args": settings,
    }
    if not args.skip_tests:
        report["kernel_tests"] = run_kernel_tests()
        print(report["kernel_tests"]["tail"])
    report["copy_bandwidth_gbs"] = copy_bandwidth_gbs(device)
    report["matmul_bf16_tflops"] = matmul_tflops(device)
    config = llama3_8b_config(num_hidden_layers=args.layers)
    facts = ModelFacts.of(config, torch.bfloat16)
    report["model"] = asdict(facts)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvserve-gpu-check-"))
    save_random_checkpoint(workdir, config, torch.bfloat16, device)
    torch.cuda.empty_cache()

    start = time.perf_counter()
    engine = LLMEngine(
        EngineConfig(
            model=str(workdir),
            dtype="bfloat16",
            max_model_len=2 * args.max_len + 16,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=False,
        )
    )
    report["engine_start_s"] = time.perf_counter() - start
    report["kv_blocks"] = engine.plan.num_kv_blocks
    decode = {}
    for batch in args.batches:
        result = measure_decode(engine, batch, args.decode_prompt, args.decode_steps, args.seed)
        floor = decode_floor_ms(facts, result["context_tokens"], report["copy_bandwidth_gbs"])
        decode[batch] = result | {"floor_ms": floor, "floor_share": floor / result["step_ms"]}
        print(f"decode batch {batch}: {decode[batch]}")
    report["decode"] = decode
    report["syncs_per_decode_step"] = count_decode_syncs(engine, 8, 8)
    tokens_per_s = measure_prefill(engine, args.prefill_prompts, args.prefill_len, args.seed)
    floor = prefill_floor_tokens_per_s(facts, report["matmul_bf16_tflops"])
    report["prefill"] = {"tokens_per_s": tokens_per_s, "floor_tokens_per_s": floor}
    print(f"prefill: {report['prefill']}")

    workload = Workload.random(
        args.requests, args.min_len, args.max_len, config.vocab_size, args.seed
    )
    outputs, wall = run_kvserve(engine, workload)
    report["e2e"] = {"kvserve_tokens_per_s": sum(map(len, outputs)) / wall}
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    if not args.skip_transformers:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(workdir, dtype=torch.bfloat16).to(device)
        hf_outputs, hf_wall = run_transformers(model.eval(), workload)
        report["e2e"]["transformers_tokens_per_s"] = sum(map(len, hf_outputs)) / hf_wall
        same = sum(a == b for a, b in zip(outputs, hf_outputs, strict=True))
        report["e2e"]["identical_outputs"] = same / len(outputs)
        report["e2e"]["leading_agreement"] = leading_agreement(outputs, hf_outputs)
    print(f"end to end: {report['e2e']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if report.get("kernel_tests", {}).get("returncode", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
