"""A step's facts are settled when the scheduler makes the step: which requests sample and
which prompt positions score prompt logprobs, read as recorded by the runner (its logits
rows), the engine and the scheduler's update."""

import pytest

from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.sampling_params import SamplingParams

from factories import finish_step, make_request, make_scheduler


def test_a_mixed_step_records_who_samples_and_the_prompt_logprob_spans():
    s = make_scheduler(block_size=4, max_num_batched_tokens=12)
    a = make_request(5, max_tokens=8)
    s.add(a)
    finish_step(s, s.schedule())  # a decodes from now on
    b = make_request(6, prompt_logprobs=1)  # its whole prompt fits: it samples
    c = make_request(20, prompt_logprobs=0)  # a first chunk: no token yet
    s.add(b)
    s.add(c)
    out = s.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [
        (a.request_id, 1),
        (b.request_id, 6),
        (c.request_id, 5),
    ]
    facts = (out.sampling_requests, out.prompt_logprob_spans)
    assert facts == ([a, b], [(b, range(0, 5)), (c, range(0, 5))])
    finish_step(s, out)  # every request moved on: the step's facts stay as they were
    assert (out.sampling_requests, out.prompt_logprob_spans) == facts
    out = s.schedule()
    assert (out.sampling_requests, out.prompt_logprob_spans) == ([a, b], [(c, range(5, 15))])


def test_dropping_finished_requests_keeps_the_rest_of_the_facts():
    s = make_scheduler()
    a, b = make_request(4), make_request(4, prompt_logprobs=0)
    s.add(a)
    s.add(b)
    out = s.schedule()
    s.abort(b, "error")
    kept = out.without_finished()
    assert ([r for r, _ in kept.scheduled], kept.sampling_requests) == ([a], [a])
    assert kept.prompt_logprob_spans == []


@pytest.fixture
def engine(checkpoint):
    return LLMEngine(
        EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64, max_num_batched_tokens=12)
    )


def test_the_runner_takes_its_logits_rows_from_the_recorded_facts(engine):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("a", [5, 6, 7, 8, 9], greedy)
    engine.step()
    engine.add_request("b", [10, 11, 12, 13, 14, 15], greedy.replace(prompt_logprobs=1))
    engine.add_request("c", list(range(20, 40)), greedy.replace(prompt_logprobs=0))
    out = engine.scheduler.schedule()
    assert [n for _, n in out.scheduled] == [1, 6, 5]  # batch rows 0 | 1-6 | 7-11
    # sampling: a's row 0 and b's last row 6; then b's positions 0-4, c's positions 0-4
    expected = [0, 6, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11]
    assert engine.runner.prepare(out).logits_indices.tolist() == expected
