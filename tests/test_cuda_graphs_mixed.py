"""CUDA graphs of mixed steps (decodes with small prefill chunks): their buckets, and the
padded static layout a graph replays, run eagerly (on the CPU through the interpreted Triton
kernels) for every step of an engine, against the unpadded step and transformers."""

from pathlib import Path

import pytest
import torch
from joined_outputs import JoinedOutputs

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.executor.model_runner import ModelRunner
from kvserve.engine.graphs.cuda_graphs import CUDAGraphs
from kvserve.engine.graphs.graph_buckets import Bucket, MixedBuckets, capture_sizes
from kvserve.engine.graphs.padded_steps import PaddedSteps
from kvserve.engine.graphs.static_mixed_batch import StaticMixedBatch
from kvserve.engine.llm_engine import LLMEngine

from checkpoints import build_checkpoint
from reference import assert_greedy_match, hf_greedy


def test_mixed_buckets_are_few():
    buckets = MixedBuckets(512, 256)
    assert buckets.token_sizes == [64, 128, 256, 512]
    assert buckets.seq_sizes[64] == [4, 16, 64]
    assert buckets.seq_sizes[512] == [4, 16, 64, 256]
    assert buckets.query_sizes[128] == [16, 64, 128]
    assert buckets.query_sizes[512] == [16, 64, 256, 512]
    assert len(buckets.all()) == 46
    assert MixedBuckets(40, 8).all() == [Bucket(40, 4, 16), Bucket(40, 4, 40),
                                         Bucket(40, 8, 16), Bucket(40, 8, 40)]  # fmt: skip


@pytest.mark.parametrize(
    ("tokens", "seqs", "max_query_len", "expected"),
    [
        (511, 256, 256, Bucket(512, 256, 256)),  # 255 decodes and a 256-token prompt
        (64, 3, 62, Bucket(64, 4, 64)),
        (65, 3, 62, Bucket(128, 4, 64)),
        (20, 17, 4, Bucket(64, 64, 16)),
        (300, 2, 299, Bucket(512, 4, 512)),
        (513, 2, 300, None),  # more tokens than any graph
        (60, 65, 2, None),  # more sequences (or rows out) than a 64-token shape holds
    ],
)
def test_a_step_pads_to_the_smallest_bucket_that_holds_it(tokens, seqs, max_query_len, expected):
    assert MixedBuckets(512, 256).choose(tokens, seqs, max_query_len) == expected


def test_a_mixed_step_needs_two_tokens():
    with pytest.raises(ValueError, match="a mixed step has 2 tokens or more, got max_tokens 1"):
        MixedBuckets(1, 8)


def test_a_mixed_static_batch_has_no_state_slots():
    with pytest.raises(ValueError, match="a mixed step's static batch has no state slots"):
        StaticMixedBatch(64, 8, 4, torch.device("cpu"), layout=[0, -1])


class PaddedEagerly:
    """In the model's place: every step copied into the static inputs of its bucket and the
    model run eagerly on them (the body a CUDA graph captures), its own rows checked
    against the unpadded step's; ``seen``: each step's (tokens, sequences, largest query)
    and bucket."""

    def __init__(self, runner: ModelRunner, mixed: MixedBuckets) -> None:
        plan = runner.plan
        self.model = runner.model
        self.steps = PaddedSteps(
            runner.model, runner.kv_caches, capture_sizes(plan.max_num_seqs), mixed,
            plan.max_blocks_per_seq, plan.device, runner._static_layout(),
        )  # fmt: skip
        self.seen: list[tuple[tuple[int, int, int], Bucket]] = []

    def __call__(self, input_ids, positions, kv_caches, meta, out_rows=None):
        bucket = self.steps.bucket(input_ids, kv_caches, meta, out_rows)
        assert bucket is not None
        expected = self.model(input_ids, positions, kv_caches, meta, out_rows)
        count = self.steps.fill(bucket, input_ids, positions, meta, out_rows)
        padded = self.steps.run(bucket)
        assert padded.shape[0] == bucket.seqs
        padded = padded[:count]
        torch.testing.assert_close(padded, expected, rtol=1e-5, atol=1e-5)
        logits = self.model.logits
        assert torch.equal(logits(padded).argmax(-1), logits(expected).argmax(-1))
        first = meta[0] if isinstance(meta, list) else meta
        self.seen.append(((input_ids.shape[0], first.num_seqs, first.max_query_len), bucket))
        return padded


PROMPTS = {
    "a": [5, 6, 7, 8, 9],
    "b": [11, 12, 13],
    "c": [(17 * i) % 400 + 2 for i in range(62)],
    "d": [(29 * i) % 400 + 3 for i in range(100)],
    "e": [21, 22, 23, 24, 25, 26, 27],
    "f": [31, 32, 33, 34, 35, 36, 37, 38, 39],
}
ARRIVALS = {0: "ab", 2: "c", 3: "d", 6: "ef"}
"""At 80 tokens a step: two prompts alone, decodes alone, two decodes and a 62-token chunk
(64 tokens, a bucket's own size), three decodes and a 77-token chunk (past it), three
decodes and the rest, four decodes and two prompts."""
MAX_TOKENS = 10


def mixed_engine(path: str | Path) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(path), dtype="float32", attention_backend="triton", block_size=4,
            num_kv_blocks=128, max_num_seqs=8, max_num_batched_tokens=80,
            enable_prefix_caching=False,
        )
    )  # fmt: skip


def assert_arrivals_match_transformers(
    engine: LLMEngine, path: str | Path, arrivals: dict[int, str] = ARRIVALS
) -> None:
    """``PROMPTS`` arriving at the steps ``arrivals`` says, each with transformers' greedy
    tokens."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    results, joined, step = {}, JoinedOutputs(), 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for name in arrivals.get(step, ""):
            engine.add_request(name, PROMPTS[name], params)
        for out in joined.add(engine.step()):
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        step += 1
    for name in "".join(arrivals.values()):
        prompt = PROMPTS[name]
        expected = hf_greedy(str(path), prompt, MAX_TOKENS)
        assert_greedy_match(str(path), prompt, expected, results[name])


def test_padded_mixed_steps_give_the_unpadded_rows_and_transformers_tokens(checkpoint):
    """Decode-only steps, decodes with one chunk, several chunks with and without decodes,
    a step of exactly a bucket's tokens and one a token past it: each through the padded
    static layout, the same greedy tokens as the unpadded steps and transformers."""
    path = str(checkpoint("llama"))
    engine = mixed_engine(path)
    padded = PaddedEagerly(engine.runner, MixedBuckets(128, 8))
    engine.runner.forward = padded
    assert_arrivals_match_transformers(engine, path)
    seen = dict(padded.seen)
    assert seen[(8, 2, 5)] == Bucket(64, 4, 16)  # two prompts, no decodes
    assert seen[(2, 2, 1)] == Bucket(2, 2, 1)  # decodes alone
    assert seen[(64, 3, 62)] == Bucket(64, 4, 64)  # two decodes and a chunk: 64 tokens
    assert seen[(80, 4, 77)] == Bucket(128, 4, 128)  # three decodes and a chunk: past 64
    assert seen[(20, 6, 9)] == Bucket(64, 8, 16)  # four decodes and two prompts


def test_padded_mixed_steps_of_two_kv_groups(tmp_path):
    """A model of two KV groups (Qwen2, its second layer windowed): each group's slots and
    tables in their own static rows, the same rows and tokens through the padded layout."""
    path = build_checkpoint(
        "qwen2", tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=1
    )
    engine = mixed_engine(path)
    assert engine.runner._static_layout() == [0, 1]
    padded = PaddedEagerly(engine.runner, MixedBuckets(128, 8))
    engine.runner.forward = padded
    assert_arrivals_match_transformers(engine, path, {0: "ab", 2: "c"})
    assert dict(padded.seen)[(64, 3, 62)] == Bucket(64, 4, 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="replays captured CUDA graphs")
def test_replayed_mixed_graphs_give_transformers_tokens(checkpoint):
    """The same arrivals on CUDA with the graphs the engine captured (80 tokens at most:
    token sizes 64 and 80): every step of them replays one, mixed steps included."""
    path = str(checkpoint("llama"))
    engine = mixed_engine(path)
    graphs = engine.runner.forward
    assert isinstance(graphs, CUDAGraphs)
    assert graphs.steps.mixed is not None and graphs.steps.mixed.token_sizes == [64, 80]
    replayed: list[Bucket] = []
    eager: list[int] = []
    fill, model = graphs.steps.fill, graphs.model

    def filled(bucket, *args):
        replayed.append(bucket)
        return fill(bucket, *args)

    def eagerly(input_ids, *args):  # CUDAGraphs calls its model for the steps it cannot hold
        eager.append(input_ids.shape[0])
        return model(input_ids, *args)

    graphs.steps.fill = filled
    graphs.model = eagerly
    assert_arrivals_match_transformers(engine, path)
    assert Bucket(64, 4, 64) in replayed and Bucket(80, 4, 80) in replayed
    assert eager == []
