"""A verification step's attention as one decode sequence a row: the lengths and tables
each row reads; on a CPU, the step replayed from a recorded decode step of as many rows gives
the eager step's logits bit for bit, and the tokens of a run without speculation."""

import numpy as np
import pytest
import torch

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.graphs.cpu_graphs import CPUDecodeGraphs, Recording
from kvserve.engine.kernels import cpu_library
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.spec_decode.decode_rows import as_decode_rows

from audit import assert_all_released

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
PROMPTS = [[11, 12, 13, 14, 15] * 4, [7, 8, 9, 10, 7, 8, 9, 10, 7]]


def test_each_row_reads_its_request_blocks_up_to_its_own_position():
    tables = np.array([[4, 5, 6], [9, 0, 0]], dtype=np.int32)
    query_lens, seq_lens, rows = as_decode_rows([3, 1], [10, 5], tables)
    assert query_lens == [1, 1, 1, 1]
    assert seq_lens == [8, 9, 10, 5]
    assert rows.tolist() == [[4, 5, 6], [4, 5, 6], [4, 5, 6], [9, 0, 0]]


def run(path: str, enforce_eager: bool, speculation: bool):
    """Every step's logits and each request's tokens over PROMPTS, greedy; the engine."""
    settings = {"speculative_config": NGRAM} if speculation else {}
    engine = LLMEngine(
        EngineConfig(
            model=path,
            dtype="float32",
            device="cpu",
            enforce_eager=enforce_eager,
            num_kv_blocks=64,
            block_size=4,
            **settings,
        )
    )
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    logits, tokens = [], {str(i): [] for i in range(len(PROMPTS))}
    execute = engine.runner.execute

    def kept(out):
        logits.append(execute(out))
        return logits[-1]

    engine.runner.execute = kept
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.outputs[0].token_ids
    assert_all_released(engine)
    return logits, tokens, engine


@pytest.mark.skipif(not cpu_library.available(), reason="needs the C kernels")
def test_replayed_verification_steps_give_the_eager_logits_bit_for_bit(checkpoint, monkeypatch):
    path = str(checkpoint("llama"))
    _, plain, _ = run(path, enforce_eager=True, speculation=False)
    eager, eager_tokens, _ = run(path, enforce_eager=True, speculation=True)
    replays: list[int] = []
    replay = Recording.replay
    monkeypatch.setattr(Recording, "replay", lambda self: (replays.append(1), replay(self)))
    replayed, tokens, engine = run(path, enforce_eager=False, speculation=True)
    graphs = engine.runner.forward
    assert isinstance(graphs, CPUDecodeGraphs) and graphs.refused == set()
    # verification steps of both requests: 2 rows plus their drafts, a recording a size
    assert max(graphs.recordings) > len(PROMPTS) and replays
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert [t.shape for t in replayed] == [t.shape for t in eager]
    for step, (ours, theirs) in enumerate(zip(replayed, eager, strict=True)):
        assert torch.equal(ours, theirs), f"step {step}"
    assert tokens == eager_tokens == plain
