"""Multi-node execution on a CPU, in one run on one model (llama-134m in float32, one torch
thread per rank):

A. The per-step cost of the cross-process exchange: decode steps of a batch at TP=1 (one
   process), TP=2 on one node (rank 1 a worker process fed through a socket pair: the
   existing tensor-parallel path) and TP=2 across two "nodes" (rank 1 in a headless node,
   ``kvserve serve --headless``, fed through the leader's TCP step socket; its gloo group
   over TCP too). Both nodes are processes on this machine (127.0.0.1): the numbers are the
   cost of the processes and the protocol, not of a network.
B. W1 throughput (throughput.py's workload, scaled by --requests and --max-tokens) at PP=1
   (one process, one and two threads) against PP=2 (two stages, one thread each) on one
   node, with and without micro-batches (``engine/executor/micro_batches.py``), and PP=2
   across two nodes.

    python benchmarks/multinode_cpu.py [--requests N] [--max-tokens N] [--batch N]

Not a test; writes benchmarks/results/multinode-cpu.md.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import torch
from checkpoint import build_checkpoint, llama_config, save_tokenizer
from machine import describe
from throughput import Workload
from transformers import AutoModelForCausalLM

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.executor import micro_batches
from kvserve.engine.executor.distributed import free_port
from kvserve.engine.llm_engine import LLMEngine

HERE = Path(__file__).resolve().parent
SETTINGS = dict(dtype="float32", max_model_len=1024, num_kv_blocks=1024)


def headless(config: EngineConfig) -> subprocess.Popen:
    """Node 1 of ``config``'s two (``kvserve serve --headless``), one thread per rank."""
    argv = [
        sys.executable, "-m", "kvserve.server.cli", "serve", "--headless",
        "--model", config.model, "--dtype", config.dtype, "--max-model-len", "1024",
        "--num-kv-blocks", str(config.num_kv_blocks), "--nnodes", "2", "--node-rank", "1",
        "--master-port", str(config.master_port),
        "--tensor-parallel-size", str(config.tensor_parallel_size),
        "--pipeline-parallel-size", str(config.pipeline_parallel_size),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def engine(model: Path, threads: int, nodes: int, **layout: int) -> tuple[LLMEngine, object]:
    """An engine over ``nodes`` nodes (the second a headless subprocess) and that node, with
    ``threads`` torch threads in this process before the executor divides them."""
    torch.set_num_threads(threads)
    extra = dict(nnodes=2, master_port=free_port()) if nodes == 2 else {}
    config = EngineConfig(model=str(model), **SETTINGS, **layout, **extra)  # type: ignore[arg-type]
    node = headless(config) if nodes == 2 else None
    return LLMEngine(config), node


def close(llm: LLMEngine, node: subprocess.Popen | None) -> None:
    llm.shutdown()
    if node is not None:
        node.wait(60)


@contextmanager
def micro_batched(on: bool) -> Iterator[None]:
    """Off: the leader sends each pipeline step whole (the lever measured: ``split`` as if
    every step were one micro-batch)."""
    if on:
        yield
        return
    split = micro_batches.split
    micro_batches.split = lambda out, count: [out]
    try:
        yield
    finally:
        micro_batches.split = split


def start_decoding(llm: LLMEngine, batch: int, prompt: int, steps: int) -> None:
    """``batch`` sequences of ``prompt`` tokens prefilled, each to decode ``steps`` more."""
    params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for i in range(batch):
        llm.add_request(f"d{i}", [2 + (i * 7 + j) % 31000 for j in range(prompt)], params)
    llm.step()


def step_ms(llm: LLMEngine, steps: int) -> list[float]:
    """Wall ms of each of ``steps`` engine steps."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        llm.step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def exchange_model(directory: Path) -> Path:
    """llama-134m's 12 layers and vocabulary at hidden 256 (4 heads of 64, MLP 512): its
    per-step collectives (24 all-reduces, the LM head's all-gather of 32000 logits a row)
    with a ninth of its layers' matmul work, so that a step is mostly the exchange."""
    config = llama_config(torch.float32)
    config.update(dict(hidden_size=256, intermediate_size=512, head_dim=64))
    config.update(dict(num_attention_heads=4, num_key_value_heads=4))
    directory.mkdir(parents=True)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    save_tokenizer(directory, config.vocab_size)
    return directory


def w1(llm: LLMEngine, workload: Workload) -> tuple[float, int]:
    """Wall seconds and output tokens of the workload, all requests added at once."""
    params = SamplingParams(temperature=0, max_tokens=workload.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(workload.prompts):
        llm.add_request(f"w{i}", prompt, params)
    tokens = 0
    while llm.has_unfinished_requests():
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.step())
    return time.perf_counter() - start, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--batch", type=int, default=16, help="sequences of part A's decode steps")
    p.add_argument("--steps", type=int, default=10, help="part A: decode steps per round")
    p.add_argument("--rounds", type=int, default=10, help="part A: rounds over the layouts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "multinode-cpu.md")
    args = p.parse_args()
    workload = Workload.random(
        args.requests, args.min_prompt, args.max_prompt, args.max_tokens, args.seed
    )
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    steps_rows, w1_rows = [], []
    with tempfile.TemporaryDirectory(prefix="kvserve-multinode-") as tmp:
        model = build_checkpoint(Path(tmp) / "model", torch.float32, args.seed).directory
        small = exchange_model(Path(tmp) / "small")
        runs_a = [
            ("TP=1, one process", 1, dict()),
            ("TP=2, one node: rank 1 a worker process (socket pair)", 1,
             dict(tensor_parallel_size=2)),
            ("TP=2, two nodes: rank 1 on a headless node (TCP)", 2,
             dict(tensor_parallel_size=2)),
        ]  # fmt: skip
        engines = [engine(small, 1, nodes, **layout) for _, nodes, layout in runs_a]
        times: list[list[float]] = [[] for _ in runs_a]
        try:
            for llm, _ in engines:
                start_decoding(llm, args.batch, 64, args.rounds * args.steps)
            for _ in range(args.rounds):  # interleaved: the machine's drift hits all alike
                for index, (llm, _) in enumerate(engines):
                    times[index].extend(step_ms(llm, args.steps))
        finally:
            for llm, node in engines:
                close(llm, node)
        medians = [statistics.median(t) for t in times]
        for (name, _, _), ms in zip(runs_a, medians, strict=True):
            steps_rows.append(f"| {name} | {ms:.2f} | {ms - medians[0]:+.2f} |")
            print(steps_rows[-1], file=sys.stderr, flush=True)
        pp2 = dict(pipeline_parallel_size=2)
        runs_b = [
            ("PP=1, one process (1 thread)", 1, 1, dict(), True),
            ("PP=1, one process (2 threads)", 2, 1, dict(), True),
            ("PP=2, one node, no micro-batches", 2, 1, pp2, False),
            ("PP=2, one node, 2 micro-batches per step", 2, 1, pp2, True),
            ("PP=2, two nodes (a stage each), 2 micro-batches", 1, 2, pp2, True),
            ("PP=1 again, 1 thread (order effects)", 1, 1, dict(), True),
        ]
        rate_base = None
        for name, threads, nodes, layout, micro in runs_b:
            llm, node = engine(model, threads, nodes, **layout)
            try:
                with micro_batched(micro):
                    w1(llm, Workload(workload.prompts[:2], 4))  # warm-up
                    wall, tokens = w1(llm, workload)
            finally:
                close(llm, node)
            rate = tokens / wall
            rate_base = rate_base or rate
            w1_rows.append(f"| {name} | {wall:.1f} | {rate:.1f} | {rate / rate_base:.2f}x |")
            print(w1_rows[-1], file=sys.stderr, flush=True)
    lines = [
        f"# Multi-node execution on a CPU ({started})",
        "",
        describe(),
        "",
        "Float32, one run, in one process (plus its worker and headless-node processes), "
        "each rank one torch thread unless said. Two nodes = two processes on 127.0.0.1.",
        "",
        f"## A. Decode step, {args.batch} sequences of 64-token prompts",
        "",
        "The exchange-bound shape (`exchange_model`: llama-134m's 12 layers and 32000-token "
        "vocabulary at hidden 256, 4 heads): per step 24 all-reduces of [batch, 256] and "
        "the LM head's all-gather, with little compute. The three engines are alive at once "
        f"and stepped in turn, {args.steps} steps each per round, {args.rounds} rounds; the "
        "median step.",
        "",
        "| layout | ms per step | vs TP=1 |",
        "| --- | ---: | ---: |",
        *steps_rows,
        "",
        "The difference between the two TP=2 rows is the cost of the cross-node path (the "
        "step frame over TCP instead of a socket pair; gloo over TCP both times).",
        "",
        f"## B. W1 on llama-134m: {args.requests} requests, prompts of "
        f"{args.min_prompt}-{args.max_prompt} tokens, {args.max_tokens} output tokens each "
        "(greedy)",
        "",
        "| layout | W1 wall (s) | output tok/s | vs PP=1 (1 thread) |",
        "| --- | ---: | ---: | ---: |",
        *w1_rows,
        "",
        "Without micro-batches a step's stages run one after the other, one stage idle "
        "while the other computes; with 2 micro-batches stage 0 computes the second while "
        "stage 1 computes the first. Two threads in one process contend with the machine's "
        "other load (OpenMP threads spin): both PP=1 rows are given, vs PP=1 on one thread.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
