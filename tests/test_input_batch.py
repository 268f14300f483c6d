"""The runner's persistent block-table rows: after every step they hold exactly the KV
manager's block ids, through new requests, appended blocks, preemption and resumption,
finished requests whose rows are reused, dropped draft blocks and sliding windows; and
every step of an engine under block pressure gathers its requests' own tables and slots."""

import numpy as np
import pytest
import torch
from test_kv_cache_sliding_window import HYBRID, advance

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.executor.input_batch import InputBatch
from kvserve.engine.llm_engine import LLMEngine

from factories import finish_step, make_request, make_scheduler

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
WHERE = ["cpu", "cpu, device copy"] + (["cuda"] if torch.cuda.is_available() else [])


def new_batch(where: str, num_groups: int, max_num_seqs: int, max_blocks: int) -> InputBatch:
    """An ``InputBatch`` of block size 4: the CPU's (tables gathered from the host), the
    CPU's with a device copy kept as on another device (that path, run here), or CUDA's."""
    device = torch.device("cuda" if where == "cuda" else "cpu")
    batch = InputBatch(num_groups, max_num_seqs, max_blocks, 4, device)
    if where == "cpu, device copy":
        batch.on_device = torch.zeros(batch.host.shape, dtype=torch.int32)
    return batch


def gathered(batch: InputBatch, requests) -> list[list[list[int]]]:
    """Each request's tables as the step gathers them (each cut to its own length), after
    checking that every slot of its positions is the manager's block id's."""
    rows = batch.rows(requests)
    width = int(batch.num_blocks[rows].max())
    tables = batch.block_tables(rows, width)
    assert [t.shape for t in tables] == [(len(requests), width)] * len(tables)
    lengths = [r.num_computed_tokens + 1 for r in requests]
    token_rows = np.repeat(rows, lengths)
    positions = np.concatenate([np.arange(n) for n in lengths])
    for group, slots in enumerate(batch.slot_mappings(token_rows, positions)):
        size = batch.block_size
        expected = [
            r.block_tables[group][p // size] * size + p % size
            for r, n in zip(requests, lengths, strict=True)
            for p in range(n)
        ]
        assert slots.tolist() == expected
    return [
        [tables[g][i, : len(r.block_tables[g])].tolist() for g in range(len(tables))]
        for i, r in enumerate(requests)
    ]


def step(scheduler, batch: InputBatch):
    """Schedule a step, check the rows of its requests against the manager's tables, and
    finish it (each sampling request gets a token)."""
    out = scheduler.schedule()
    requests = [r for r, _ in out.scheduled]
    assert gathered(batch, requests) == [r.block_tables for r in requests]
    finish_step(scheduler, out)
    return out


@pytest.mark.parametrize("where", WHERE)
def test_rows_follow_appends_preemption_resumption_and_finish(where):
    s = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=2)
    batch = new_batch(where, 1, 2, 16)
    a, b = make_request(7, max_tokens=20), make_request(5, max_tokens=20)
    s.add(a)
    s.add(b)
    step(s, batch)
    assert (a.block_tables, b.block_tables) == ([[0, 1]], [[2, 3]])
    for _ in range(4):  # a appends block 4 at position 8, b block 5 at position 8
        step(s, batch)
    assert (a.block_tables, b.block_tables) == ([[0, 1, 4]], [[2, 3, 5]])
    step(s, batch)
    out = step(s, batch)  # a at position 12 needs a block: b is preempted
    assert out.preempted == [b] and a.block_tables == [[0, 1, 4, 5]]
    s.abort(a)
    out = step(s, batch)  # b resumes (11 tokens) in new blocks, in its own row
    assert [r for r, _ in out.scheduled] == [b] and b.block_tables == [[3, 2, 5]]
    c = make_request(3, max_tokens=20)
    s.add(c)
    out = step(s, batch)  # c takes the row a held; b's row keeps b
    assert [r for r, _ in out.scheduled] == [b, c] and c.block_tables == [[4]]
    assert batch.rows([b, c]).tolist() == [1, 0]


@pytest.mark.parametrize("where", WHERE)
def test_a_step_of_other_requests_takes_the_rows_of_those_not_scheduled(where):
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    batch = new_batch(where, 1, 2, 8)
    a, b, c = make_request(5), make_request(5), make_request(9)
    for r in (a, b, c):
        assert kv.allocate_slots(r, r.num_tokens)
    assert gathered(batch, [a, b]) == [[[0, 1]], [[2, 3]]]
    assert gathered(batch, [c, b]) == [[[4, 5, 6]], [[2, 3]]]  # a still holds its blocks
    assert gathered(batch, [a]) == [[[0, 1]]]  # a comes back: copied whole
    with pytest.raises(RuntimeError, match=r"a step of more than 2 requests \(max_num_seqs\)"):
        batch.rows([a, b, c])


@pytest.mark.parametrize("where", WHERE)
def test_a_table_past_max_blocks_per_seq_is_refused_by_name(where):
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    batch = new_batch(where, 1, 2, 2)
    a = make_request(9)
    assert kv.allocate_slots(a, 9)
    with pytest.raises(ValueError, match=r"holds 3 blocks, more than max_blocks_per_seq \(2\)"):
        batch.rows([a])


@pytest.mark.parametrize("where", WHERE)
def test_blocks_of_rejected_drafts_dropped_and_taken_again_are_copied_anew(where):
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    batch = new_batch(where, 1, 2, 8)
    a = make_request(7)
    assert kv.allocate_slots(a, 7)
    a.num_computed_tokens = 7
    a.all_token_ids.append(9)
    assert kv.allocate_slots(a, 4)  # its last token and three drafts: block 2
    assert gathered(batch, [a]) == [[[0, 1, 2]]]
    kv.free_past_computed(a)  # every draft rejected: a keeps blocks 0, 1
    a.num_computed_tokens = 8
    assert kv.allocate_slots(a, 2)  # block 2 went to the free queue's end
    assert a.block_tables == [[0, 1, 3]]  # as long as before, its last block another
    assert gathered(batch, [a]) == [[[0, 1, 3]]]


@pytest.mark.parametrize("where", WHERE)
def test_a_sliding_window_group_row_takes_the_null_block_where_blocks_left_it(where):
    kv = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=False, groups=HYBRID)
    batch = new_batch(where, 2, 2, 8)
    a = make_request(9)
    assert kv.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    assert gathered(batch, [a]) == [[[1, 2, 3], [4, 5, 6]]]
    for _ in range(4):
        advance(kv, a)
    assert kv.allocate_slots(a, 1)
    assert a.block_tables == [[1, 2, 3, 7], [0, 0, 6, 8]]
    assert gathered(batch, [a]) == [a.block_tables]


@pytest.mark.parametrize("speculative_config", [None, NGRAM], ids=["plain", "ngram"])
def test_every_step_of_an_engine_under_block_pressure_gathers_the_managers_tables(
    checkpoint, speculative_config
):
    """Preemptions, rows reused by later requests and (n-gram drafts) rejected drafts'
    blocks: each step's block tables and slots are the scheduled requests' own."""
    engine = LLMEngine(
        EngineConfig(
            model=str(checkpoint("llama")),
            block_size=4,
            num_kv_blocks=24,
            max_num_batched_tokens=24,
            max_num_seqs=4,
            speculative_config=speculative_config,
        )
    )
    prepare, checked = engine.runner.prepare, []

    def checking(out):
        inputs = prepare(out)
        meta = inputs.meta
        tables, slots = meta.block_tables.tolist(), meta.slot_mapping.tolist()
        # a sequence per request, or (a verification step on a CPU) one per row
        per_row = meta.num_seqs != len(out.scheduled)
        expected_tables, expected_slots = [], []
        for request, num_new in out.scheduled:
            table, start = request.block_ids, request.num_computed_tokens
            expected_tables += [table] * (num_new if per_row else 1)
            expected_slots += [table[p // 4] * 4 + p % 4 for p in range(start, start + num_new)]
        assert [t[: len(e)] for t, e in zip(tables, expected_tables, strict=True)] == (
            expected_tables
        )
        assert slots == expected_slots
        checked.append(per_row)
        return inputs

    engine.runner.prepare = checking
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for i in range(10):
        engine.add_request(str(i), [(7 * i + j) % 50 + 3 for j in range(5 + 3 * i)], params)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats.num_preemptions > 0 and len(checked) > 30
    assert any(checked) == (speculative_config is not None)
