"""The GPU check at serving scale: a random-weight Llama-3-8B in bf16, one command.

    python benchmarks/gpu_check.py [--out FILE] [--requests 1000] [--layers N] ...
    python benchmarks/gpu_check.py --tiny --out FILE   # the whole harness on a tiny model

Needs a CUDA device (``--tiny`` runs anywhere: a tiny model, small sizes, the CUDA-only
stages skipped). Stages, each recorded in the JSON at --out, which is written again after
every stage (a run cut off keeps what it measured; ``stages_done`` lists them):
1. ``device_tests``: DEVICE_TESTS (kernels, CUDA graphs, KV sizing, device copies, async
   scheduling, host syncs, greedy output against transformers) on the GPU, within
   --tests-timeout seconds: compiled kernels, not the interpreter.
2. ``device``: copy bandwidth and bf16 matmul rate, measured here.
3. ``kernels``: decode attention with and without its keys split, and each fused
   elementwise kernel against the torch ops it replaces, each replayed from a CUDA graph.
4. ``checkpoint``: a random-weight checkpoint of Llama-3-8B's shape, written to --workdir.
5. ``engine``: kvserve's start on it (max_num_seqs and max_num_batched_tokens: the GPU
   defaults unless given), async scheduling on.
6. ``decode``: step time at each --batches size against the floor (weights + KV bytes read)
   / copy bandwidth, and the device's busy share of a step from torch's profiler.
7. ``prefill``: one --prefill-len prompt through the engine against the matmul floor, and
   the attention of that prefill (Triton) against torch's scaled_dot_product_attention on
   the same shapes (causal, grouped KV heads).
8. ``mixed``: a step of --mixed-decodes decoding requests carrying a fresh --mixed-chunks
   prompt, replayed from a CUDA graph (where a mixed bucket holds it) against the model
   run eagerly, and the bucket it pads to.
9. ``e2e``: --requests requests of --input-len prompt tokens and --output-len output tokens
   (fixed, as the public vLLM benchmark: 1,000 x 256/256), greedy, EOS ignored; with async
   scheduling on and off, output tokens/s.
10. ``transformers`` (--transformers): transformers' continuous batching on the same
   workload; where the greedy outputs part, the checkpoint in fp32 judges (``partings``).
11. ``syncs``: device synchronisations per decode step (torch's sync debug mode).
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
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
DEVICE_TESTS = [
    "tests/test_triton_attention.py",
    "tests/test_triton_fused_moe.py",
    "tests/test_triton_w4a16.py",
    "tests/test_triton_fp8_gemm.py",
    "tests/test_triton_lora.py",
    "tests/test_kv_cache_fp8_kernels.py",
    "tests/test_cuda_graphs.py",
    "tests/test_cuda_graphs_mixed.py",
    "tests/test_kv_cache_sizing.py",
    "tests/test_device_copy.py",
    "tests/test_async_scheduling.py",
    "tests/test_host_syncs.py",
    "tests/test_engine_matches_transformers.py",
]
TINY_SHAPE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)
"""``--tiny``'s model: the harness end to end in seconds, on any device."""
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

    @classmethod
    def fixed(cls, n: int, input_len: int, output_len: int, vocab: int, seed: int) -> "Workload":
        """``n`` prompts of ``input_len`` random ids (not 0 or 1), ``output_len`` tokens each."""
        rng = random.Random(seed)
        prompts = [[rng.randrange(2, vocab) for _ in range(input_len)] for _ in range(n)]
        return cls(prompts, [output_len] * n)


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


def greedy(max_tokens: int):
    from kvserve import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


@contextmanager
def decoding(engine, batch: int, prompt_len: int, params, seed: int):
    """``batch`` requests of random ``prompt_len``-token prompts sampled with ``params``,
    prefilled, so that each following step is a decode step; aborted on exit."""
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    ids = [f"decode-{batch}-{i}" for i in range(batch)]
    for request_id in ids:
        engine.add_request(request_id, [rng.randrange(2, vocab) for _ in range(prompt_len)], params)
    requests = [engine.requests[request_id] for request_id in ids]
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in requests):
        engine.step()
    try:
        yield requests
    finally:
        for request in requests:
            engine.abort_request(request.request_id)


def measure_decode(engine, batch: int, prompt_len: int, steps: int, seed: int) -> dict:
    """Median ``engine.step()`` time of ``batch`` requests all decoding, and the mean
    number of context tokens a timed step reads."""
    times, contexts = [], []
    with decoding(engine, batch, prompt_len, greedy(prompt_len + steps), seed) as requests:
        for _ in range(steps):
            contexts.append(sum(r.num_tokens for r in requests))
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
    return {"step_ms": statistics.median(times) * 1e3, "context_tokens": statistics.mean(contexts)}


def profile_decode(engine, batch: int, prompt_len: int, steps: int, seed: int) -> dict:
    """Where a decode step's time goes, from torch's profiler over ``steps`` decode steps:
    the wall time per step, the device's busy time per step (every kernel and copy), and
    the operations and kernels with the most self time, host and device, per step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with decoding(engine, batch, prompt_len, greedy(prompt_len + steps + 1), seed):
        engine.step()  # the first decode step of this batch size outside the profile
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
    averages = prof.key_averages()

    def top(attribute: str) -> list[tuple[str, float]]:
        ranked = sorted(averages, key=lambda e: getattr(e, attribute), reverse=True)
        return [(e.key, getattr(e, attribute) / 1e3 / steps) for e in ranked[:15]]

    return {
        "step_ms": wall * 1e3 / steps,
        "device_busy_ms": sum(e.self_device_time_total for e in averages) / 1e3 / steps,
        "top_host_ms": top("self_cpu_time_total"),
        "top_device_ms": top("self_device_time_total"),
    }


def count_decode_syncs(engine, batch: int, steps: int) -> float:
    """Device synchronisations per decode step (temperature and top-p sampling), as
    torch's sync debug mode reports them."""
    from kvserve import SamplingParams

    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=steps + 8, ignore_eos=True)
    with (
        decoding(engine, batch, 64, params, seed=0),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
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


def measure_mixed(engine, decodes: int, chunk: int, steps: int, seed: int) -> dict:
    """Median wall time of a step of ``decodes`` decoding requests plus a fresh ``chunk``-token
    prompt (sampling one token, so every timed step is a mixed one), with the model runner's
    forward as built (replaying a CUDA graph where a bucket holds the step) and with the
    model called eagerly; the bucket such a step pads to (None: it runs eagerly)."""
    from kvserve.engine.graphs.cuda_graphs import CUDAGraphs

    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    runner = engine.runner
    built = runner.forward
    found: dict = {"decodes": decodes, "chunk": chunk, "bucket": None}
    if isinstance(built, CUDAGraphs) and built.steps.mixed is not None:
        bucket = built.steps.mixed.choose(decodes + chunk, decodes + 1, chunk)
        found["bucket"] = asdict(bucket) if bucket is not None else None
    with decoding(engine, decodes, 64, greedy(2 * steps + 64), seed):
        try:
            for name, forward in (("graphs", built), ("eager", runner.model)):
                runner.forward = forward
                times = []
                for i in range(steps + 1):  # the first step outside the median
                    prompt = [rng.randrange(2, vocab) for _ in range(chunk)]
                    engine.add_request(f"mixed-{name}-{i}", prompt, greedy(1))
                    start = time.perf_counter()
                    engine.step()
                    times.append(time.perf_counter() - start)
                found[f"{name}_step_ms"] = statistics.median(times[1:]) * 1e3
        finally:
            runner.forward = built
    _drain(engine)  # the last prompts, and the aborted decodes (async: a step in flight)
    found["eager_over_graphs"] = found["eager_step_ms"] / found["graphs_step_ms"]
    return found


def agreeing_prefix(ours: list[int], theirs: list[int]) -> int:
    """How many tokens two outputs share before the first one they differ in."""
    pairs = zip(ours, theirs, strict=False)
    return sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))


def graph_us(fn: Callable[[], object], calls: int = 20, replays: int = 10) -> float:
    """Median microseconds per call of ``fn``, replayed from a CUDA graph of ``calls`` calls
    (as a decode step runs its kernels: no launch gaps from the host)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def decode_attention_batch(config: LlamaConfig, batch: int, context: int, device) -> tuple:
    """A decode batch of ``batch`` sequences of ``context`` tokens over a random bf16 cache
    of 16-token blocks in shuffled order: (query, key cache, value cache, metadata)."""
    from kvserve.engine.cdiv import cdiv
    from kvserve.engine.layers.attention.metadata import AttentionMetadata

    head_dim = config.head_dim
    per_seq = cdiv(context, 16)
    tables = torch.randperm(batch * per_seq, device=device).view(batch, per_seq).int()
    shape = (batch * per_seq, 16, config.num_key_value_heads, head_dim)
    caches = [torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(2)]
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(batch, dtype=torch.long, device=device),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device=device),
        block_tables=tables,
        query_lens_host=[1] * batch,
        seq_lens_host=[context] * batch,
        max_query_len=1,
        max_seq_len=context,
    )
    query = torch.randn(
        batch, config.num_attention_heads, head_dim, device=device, dtype=torch.bfloat16
    )
    return query, *caches, meta


def measure_kernels(config: LlamaConfig, device, bandwidth_gbs: float) -> dict:
    """Side by side in this run, each replayed from a CUDA graph: decode attention with
    the keys split as the launch picks vs unsplit (and the KV read floor), and each fused
    elementwise kernel vs the torch expressions it replaces, at batch 1 and 64."""
    from kvserve.engine.kernels import triton_fused
    from kvserve.engine.layers import fused_ops
    from kvserve.engine.layers.attention.triton_backend import attention_launch, paged_attention
    from kvserve.engine.layers.rotary import RotaryEmbedding
    from kvserve.engine.models.model_config import RopeConfig

    found: dict = {"attention": {}, "elementwise": {}}
    heads, kv_heads, head_dim = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    for batch, context in ((1, 528), (1, 4096), (16, 528), (64, 528)):
        query, key_cache, value_cache, meta = decode_attention_batch(config, batch, context, device)
        launch = attention_launch(batch, heads, kv_heads, head_dim, 1, torch.bfloat16)
        times = {
            splits: graph_us(
                partial(
                    paged_attention,
                    replace(launch, num_splits=splits),
                    query,
                    key_cache,
                    value_cache,
                    meta,
                    0.1,
                )
            )
            for splits in sorted({1, launch.num_splits})
        }
        kv_bytes = 2 * batch * context * kv_heads * head_dim * 2
        found["attention"][f"{batch}x{context}"] = {
            "splits": launch.num_splits,
            "us_by_splits": times,
            "floor_us": kv_bytes / (bandwidth_gbs * 1e3),
        }
    rotary = RotaryEmbedding(RopeConfig(theta=LLAMA3_8B["rope_theta"]), head_dim, 8192)
    rotary.build(torch.bfloat16, device)
    for batch in (1, 64):
        bf16 = dict(device=device, dtype=torch.bfloat16)
        x = torch.randn(batch, config.hidden_size, **bf16)
        residual = torch.randn(batch, config.hidden_size, **bf16)
        weight = torch.randn(config.hidden_size, **bf16)
        gate_up = torch.randn(batch, 2 * config.intermediate_size, **bf16)
        qkv = torch.randn(batch, (heads + 2 * kv_heads) * head_dim, **bf16)
        q = qkv[:, : heads * head_dim].view(batch, heads, head_dim)
        k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(batch, kv_heads, head_dim)
        positions = torch.arange(batch, device=device) + 500
        pairs = {
            "add_rms_norm": (
                fused_ops.rms_norm_reference,
                triton_fused.rms_norm,
                (x, weight, 1e-5, residual),
            ),
            "silu_and_mul": (
                fused_ops.silu_and_mul_reference,
                triton_fused.silu_and_mul,
                (gate_up,),
            ),
            "rope": (
                fused_ops.rope_reference,
                triton_fused.rope,
                (positions, q, k, rotary.cos_sin),
            ),
        }
        found["elementwise"][batch] = {
            name: {
                "torch_us": graph_us(partial(torch_fn, *args)),
                "triton_us": graph_us(partial(triton_fn, *args)),
            }
            for name, (torch_fn, triton_fn, args) in pairs.items()
        }
    return found


def leading_agreement(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """The mean share of each reference output that ``outputs`` repeats before the first
    token they differ in. Random weights leave near-ties in the logits, so greedy outputs
    in bf16 part within a long output; this says how far they agree first."""
    return statistics.mean(
        agreeing_prefix(ours, theirs) / len(theirs)
        for ours, theirs in zip(outputs, reference, strict=True)
    )


@torch.inference_mode()
def partings(model, workload: Workload, outputs, reference, limit: int) -> list[dict]:
    """Where greedy ``outputs`` first part from ``reference`` (up to ``limit`` requests),
    ``model`` (the judge: the checkpoint in fp32) ranks both tokens at that position.
    Each entry: the position ``at``, each token's rank (1 is the judge's argmax), the
    judge's logit of the reference token minus ours (``margin``), the gap between its
    two largest logits, and the spread (std) of its logits. Margins far under the spread
    mean the two engines chose between near-ties; a large one means one of them is wrong."""
    found = []
    for prompt, ours, theirs in zip(workload.prompts, outputs, reference, strict=True):
        at = agreeing_prefix(ours, theirs)
        if at == min(len(ours), len(theirs)):
            continue
        context = torch.tensor([prompt + theirs[:at]], device=model.device)
        logits = model(context).logits[0, -1].float()
        first, second = logits.topk(2).values.tolist()
        found.append(
            {
                "at": at,
                "ours_rank": int((logits > logits[ours[at]]).sum()) + 1,
                "reference_rank": int((logits > logits[theirs[at]]).sum()) + 1,
                "margin": float(logits[theirs[at]] - logits[ours[at]]),
                "top2_gap": first - second,
                "logit_std": float(logits.std()),
            }
        )
        if len(found) == limit:
            break
    return found


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


def run_device_tests(timeout_s: float) -> dict:
    """DEVICE_TESTS, cut off after ``timeout_s`` (returncode None then)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS]
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as cut:
        out = (cut.stdout or b"").decode(errors="replace")
        return {"returncode": None, "timed_out_s": timeout_s, "tail": out[-3000:]}
    return {"returncode": proc.returncode, "tail": proc.stdout[-3000:] + proc.stderr[-2000:]}


def prefill_attention_vs_sdpa(config: LlamaConfig, tokens: int, device, dtype) -> dict:
    """The attention of one ``tokens``-token prefill: kvserve's Triton kernel over a paged
    cache of 16-token blocks against torch's scaled_dot_product_attention on the same
    shapes (causal, grouped KV heads); milliseconds each (CUDA-graph replays on a GPU, one
    timed call elsewhere) and the largest difference of their outputs."""
    from kvserve.engine.cdiv import cdiv
    from kvserve.engine.layers.attention.metadata import AttentionMetadata
    from kvserve.engine.layers.attention.triton_backend import TritonAttention

    heads, kv_heads, head_dim = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    query, key, value = (
        randn(tokens, heads, head_dim),
        *(randn(tokens, kv_heads, head_dim) for _ in range(2)),
    )
    blocks = cdiv(tokens, 16)
    pad = blocks * 16 - tokens
    caches = [
        torch.nn.functional.pad(t, (0, 0, 0, 0, 0, pad)).view(blocks, 16, kv_heads, head_dim)
        for t in (key, value)
    ]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(tokens, device=device),
        query_start_loc=torch.tensor([0, tokens], dtype=torch.int32, device=device),
        seq_lens=torch.tensor([tokens], dtype=torch.int32, device=device),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=device)[None],
        query_lens_host=[tokens],
        seq_lens_host=[tokens],
        max_query_len=tokens,
        max_seq_len=tokens,
    )
    scale = head_dim**-0.5
    ours = partial(TritonAttention().attend, query, *caches, meta, scale)
    q, k, v = (t.transpose(0, 1)[None] for t in (query, key, value))
    sdpa = partial(
        torch.nn.functional.scaled_dot_product_attention,
        q,
        k,
        v,
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )
    difference = (ours().float() - sdpa()[0].transpose(0, 1).float()).abs().max().item()
    if device.type == "cuda":
        timed = {"triton_ms": graph_us(ours, calls=2, replays=5) / 1e3}
        timed["sdpa_ms"] = graph_us(sdpa, calls=2, replays=5) / 1e3
    else:
        timed = {
            "triton_ms": _best_seconds(ours, device, 1) * 1e3,
            "sdpa_ms": _best_seconds(sdpa, device, 1) * 1e3,
        }
    return timed | {"tokens": tokens, "max_abs_difference": difference}


class Report(dict):
    """The check's JSON: written to ``path`` after every stage (whole, then renamed into
    place), so a run cut off keeps what it measured."""

    def __init__(self, path: Path, **fields) -> None:
        super().__init__(fields, stages_done=[])
        self.path = path

    @contextmanager
    def stage(self, name: str):
        started = time.perf_counter()
        yield
        self.setdefault("stage_s", {})[name] = time.perf_counter() - started
        self["stages_done"].append(name)
        self.save()
        print(f"gpu_check: {name} done, {self['stage_s'][name]:.1f} s", flush=True)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial_path = self.path.with_suffix(".partial")
        partial_path.write_text(json.dumps(self, indent=2, default=str) + "\n")
        partial_path.replace(self.path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check.json")
    p.add_argument("--workdir", type=Path, help="where the checkpoint goes (default: a temp dir)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and small sizes, any device")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--tests-timeout", type=float, default=150.0, help="seconds for DEVICE_TESTS")
    p.add_argument("--transformers", action="store_true", help="also run transformers' batching")
    p.add_argument("--layers", type=int, default=32, help="fewer layers: a quicker, smaller run")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    p.add_argument(
        "--decode-prompt", type=int, default=512, help="prompt length when timing decode"
    )
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--profile-steps", type=int, default=8)
    p.add_argument(
        "--partings", type=int, default=32, help="partings from transformers to judge in fp32"
    )
    p.add_argument("--prefill-len", type=int, default=8192)
    p.add_argument(
        "--mixed-decodes", type=int, nargs="+", default=[63, 255],
        help="decoding requests of each timed mixed step (capped at max_num_seqs - 1)",
    )  # fmt: skip
    p.add_argument(
        "--mixed-chunks", type=int, nargs="+", default=[128, 256],
        help="the prompt each timed mixed step carries, one per --mixed-decodes",
    )  # fmt: skip
    p.add_argument("--mixed-steps", type=int, default=16)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, help="default: the engine's for the device")
    p.add_argument("--max-num-batched-tokens", type=int, help="default: the engine's")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.tiny:
        args.skip_tests, args.layers, args.batches = True, TINY_SHAPE["num_hidden_layers"], [1, 4]
        args.decode_prompt, args.decode_steps, args.profile_steps = 16, 3, 2
        args.prefill_len, args.requests, args.input_len, args.output_len = 64, 6, 12, 8
        args.mixed_decodes, args.mixed_chunks, args.mixed_steps = [3], [8], 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.tiny:
        print("gpu_check: no CUDA device here; nothing was run", file=sys.stderr)
        return 2
    from kvserve.engine.config import EngineConfig
    from kvserve.engine.llm_engine import LLMEngine

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = Report(
        args.out,
        device=torch.cuda.get_device_name(device) if cuda else "cpu",
        versions={"torch": torch.__version__, "transformers": transformers.__version__},
        args=settings,
    )
    if cuda:
        import triton

        report["versions"]["triton"] = triton.__version__
    if not args.skip_tests:
        with report.stage("device_tests"):
            report["device_tests"] = run_device_tests(args.tests_timeout)
            print(report["device_tests"]["tail"])
    with report.stage("device"):
        report["copy_bandwidth_gbs"] = copy_bandwidth_gbs(device, 2**31 if cuda else 2**24)
        report["matmul_tflops"] = matmul_tflops(device, 8192 if cuda else 256)
    shape = TINY_SHAPE if args.tiny else {}
    config = llama3_8b_config(**shape | {"num_hidden_layers": args.layers})
    facts = ModelFacts.of(config, dtype)
    report["model"] = asdict(facts)
    if cuda:
        with report.stage("kernels"):
            report["kernels"] = measure_kernels(config, device, report["copy_bandwidth_gbs"])
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvserve-gpu-check-"))
    with report.stage("checkpoint"):
        save_random_checkpoint(workdir, config, dtype, device)
        if cuda:
            torch.cuda.empty_cache()
    with report.stage("engine"):
        start = time.perf_counter()
        engine = LLMEngine(
            EngineConfig(
                model=str(workdir),
                dtype=str(dtype).removeprefix("torch."),
                device=device.type,
                max_model_len=max(args.input_len + args.output_len, args.prefill_len) + 64,
                max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                enable_prefix_caching=False,
                async_scheduling=True,
            )
        )
        report["engine_start_s"] = time.perf_counter() - start
        report["kv_blocks"] = engine.plan.num_kv_blocks
        report["batch_limits"] = [engine.plan.max_num_seqs, engine.plan.max_num_batched_tokens]
    with report.stage("decode"):
        report["decode"] = {}
        for batch in args.batches:
            result = measure_decode(engine, batch, args.decode_prompt, args.decode_steps, args.seed)
            floor = decode_floor_ms(facts, result["context_tokens"], report["copy_bandwidth_gbs"])
            profiled = profile_decode(
                engine, batch, args.decode_prompt, args.profile_steps, args.seed
            )
            report["decode"][batch] = result | {
                "floor_ms": floor,
                "floor_share": floor / result["step_ms"],
                "busy_share": profiled["device_busy_ms"] / profiled["step_ms"],
                "profile": profiled,
            }
            print(f"decode batch {batch}: {result}, busy {report['decode'][batch]['busy_share']}")
    with report.stage("prefill"):
        tokens_per_s = measure_prefill(engine, 1, args.prefill_len, args.seed)
        floor = prefill_floor_tokens_per_s(facts, report["matmul_tflops"])
        report["prefill"] = {
            "tokens_per_s": tokens_per_s,
            "floor_tokens_per_s": floor,
            "attention": prefill_attention_vs_sdpa(config, args.prefill_len, device, dtype),
        }
        print(f"prefill: {report['prefill']}")
    with report.stage("mixed"):
        report["mixed"] = {}
        most = engine.plan.max_num_seqs - 1
        for decodes, chunk in zip(args.mixed_decodes, args.mixed_chunks, strict=True):
            found = measure_mixed(engine, min(decodes, most), chunk, args.mixed_steps, args.seed)
            report["mixed"][f"{found['decodes']}+{chunk}"] = found
            print(f"mixed step: {found}")
    workload = Workload.fixed(
        args.requests, args.input_len, args.output_len, config.vocab_size, args.seed
    )
    with report.stage("e2e"):
        report["e2e"] = {}
        for on in (True, False):
            engine.set_async_scheduling(on)
            outputs, wall = run_kvserve(engine, workload)
            name = "async" if on else "sync"
            report["e2e"][f"{name}_tokens_per_s"] = sum(map(len, outputs)) / wall
            report["e2e"][f"{name}_wall_s"] = wall
        engine.set_async_scheduling(True)
        print(f"end to end: {report['e2e']}")
    if cuda:
        with report.stage("syncs"):
            report["syncs_per_decode_step"] = count_decode_syncs(engine, 8, 8)
    del engine
    gc.collect()
    if args.transformers:
        with report.stage("transformers"):
            report["transformers"] = compare_transformers(workdir, workload, outputs, args, device)
    print(f"wrote {args.out}")
    return 0 if report.get("device_tests", {}).get("returncode", 0) == 0 else 1


def compare_transformers(workdir: Path, workload: Workload, outputs, args, device) -> dict:
    """transformers' continuous batching on the workload, and how its greedy outputs agree
    with kvserve's (partings judged in fp32)."""
    from transformers import AutoModelForCausalLM

    if device.type == "cuda":
        torch.cuda.empty_cache()
    model = AutoModelForCausalLM.from_pretrained(workdir, dtype=torch.bfloat16).to(device)
    hf_outputs, hf_wall = run_transformers(model.eval(), workload)
    found: dict = {"tokens_per_s": sum(map(len, hf_outputs)) / hf_wall}
    found["identical_outputs"] = sum(
        a == b for a, b in zip(outputs, hf_outputs, strict=True)
    ) / len(outputs)
    found["leading_agreement"] = leading_agreement(outputs, hf_outputs)
    judged = partings(model.float(), workload, outputs, hf_outputs, args.partings)
    found["partings"] = judged
    if judged:
        found["partings_median"] = {
            key: statistics.median(p[key] for p in judged)
            for key in ("at", "ours_rank", "reference_rank", "margin", "top2_gap", "logit_std")
        }
    return found


if __name__ == "__main__":
    sys.exit(main())
