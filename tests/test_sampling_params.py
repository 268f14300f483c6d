"""The full sampling parameter set, row by row against plain per-request Python."""

import math

import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.engine.core.request import Request
from kvserve.engine.host_copy import HostCopies
from kvserve.engine.prompt_logprobs import prompt_tables, record_prompt_logprobs
from kvserve.engine.sampler import Sampler

VOCAB = 32
EOS = 0


def _request(i: int, prompt: list[int], output: list[int], **params) -> Request:
    request = Request(str(i), prompt, SamplingParams(**params))
    request.all_token_ids.extend(output)
    return request


def _expected_logits(logits: torch.Tensor, request: Request) -> torch.Tensor:
    """Bias, penalties and the min_tokens ban, one request at a time."""
    p, row = request.params, logits.clone()
    for token, bias in p.logit_bias.items():
        row[token] += bias
    output = request.output_token_ids
    for token in set(output):
        row[token] -= p.frequency_penalty * output.count(token) + p.presence_penalty
    for token in set(request.all_token_ids):
        value = row[token]
        row[token] = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
    if len(output) < p.min_tokens:
        for token in (EOS, *p.stop_token_ids):
            row[token] = -math.inf
    return row


BATCH = [
    _request(0, [1, 2, 3], [4, 4, 5], temperature=0),
    _request(1, [1, 2, 3], [4, 4, 5], temperature=0, presence_penalty=1.5),
    _request(2, [1, 2, 3], [4, 4, 5, 4], temperature=0, frequency_penalty=-0.7),
    _request(3, [6, 7], [7, 8], temperature=0, repetition_penalty=1.8),
    _request(4, [6], [9], temperature=0, logit_bias={3: 2.5, 10: -50.0}),
    _request(5, [6], [9], temperature=0, min_tokens=3, stop_token_ids=[11]),
    _request(6, [6], [9, 9, 9], temperature=0, min_tokens=3, stop_token_ids=[11]),
    _request(
        7, [2, 2], [2, 3], temperature=0, presence_penalty=0.5, frequency_penalty=0.5,
        repetition_penalty=1.3, logit_bias={2: 1.0},
    ),
]  # fmt: skip


def test_adjusted_logits_equal_the_per_request_rules():
    logits = torch.randn(len(BATCH), VOCAB, generator=torch.Generator().manual_seed(0))
    got = Sampler([EOS]).adjust_logits(logits, BATCH)
    for row, request in enumerate(BATCH):
        assert torch.allclose(got[row], _expected_logits(logits[row], request)), row


def test_greedy_picks_the_argmax_of_the_adjusted_logits():
    logits = torch.zeros(2, VOCAB)
    logits[:, 4] = 1.0
    logits[:, 6] = 0.9
    batch = [BATCH[0], BATCH[1]]  # 4 was generated twice; only the second row is penalised
    assert Sampler([EOS])(logits, batch).token_ids == [4, 6]


def test_min_tokens_bans_eos_and_stop_ids_until_reached():
    logits = torch.zeros(2, VOCAB)
    logits[:, EOS] = 5.0
    logits[:, 11] = 4.0
    logits[:, 12] = 3.0
    assert Sampler([EOS])(logits, [BATCH[5], BATCH[6]]).token_ids == [12, EOS]


def test_logprobs_are_the_log_softmax_of_the_raw_logits():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    batch = [
        _request(0, [1], [], temperature=0, logprobs=3, presence_penalty=2.0),
        _request(1, [1], [], temperature=0, logprobs=0, logit_bias={5: 100.0}),
        _request(2, [1], [], temperature=0),
    ]
    out = Sampler([EOS])(logits, batch)
    reference = torch.log_softmax(logits, dim=-1)
    first, second, third = out.logprobs
    assert third is None
    assert first.token_id == out.token_ids[0]
    assert first.logprob == pytest.approx(reference[0, first.token_id].item(), abs=1e-6)
    values, ids = reference[0].topk(3)
    assert [t for t, _ in first.top] == ids.tolist()
    assert [v for _, v in first.top] == pytest.approx(values.tolist(), abs=1e-6)
    assert out.token_ids[1] == 5  # the bias chose it; its logprob is still the raw one
    assert second.logprob == pytest.approx(reference[1, 5].item(), abs=1e-6)
    assert second.top == ()


def test_prompt_logprobs_ride_in_the_samplers_one_copy():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    request = _request(0, [3, 7, 9, 2, 5], [], temperature=0, prompt_logprobs=2)
    found = prompt_tables([(request, range(0, 3))], logits[1:])
    before = HostCopies.count
    out = Sampler([EOS])(logits[:1], [BATCH[0]], also=found.tables)
    assert HostCopies.count == before + 1
    assert out.token_ids == [int(logits[0].argmax())]
    assert record_prompt_logprobs(found, out.also) == []
    reference = torch.log_softmax(logits[1:], dim=-1)
    assert len(request.prompt_logprobs) == 4
    for position, found_lp in enumerate(request.prompt_logprobs[1:]):
        assert found_lp is not None
        target = request.prompt_token_ids[position + 1]
        assert found_lp.token_id == target
        assert found_lp.logprob == pytest.approx(reference[position, target].item(), abs=1e-6)
        assert [t for t, _ in found_lp.top] == reference[position].topk(2).indices.tolist()


def test_a_seed_gives_the_same_draws_whatever_else_is_batched():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(2))

    def draws(batch_size: int) -> list[int]:
        seeded = _request(0, [1], [], temperature=1.0, seed=1234, top_p=0.9)
        others = [_request(i, [1], [], temperature=1.5) for i in range(1, batch_size)]
        sampler, tokens = Sampler([EOS]), []
        for _ in range(20):
            batch = [*others[: len(others) // 2], seeded, *others[len(others) // 2 :]]
            out = sampler(logits.expand(len(batch), -1), batch)
            tokens.append(out.token_ids[len(others) // 2])
        return tokens

    alone = draws(1)
    assert draws(5) == alone
    assert len(set(alone)) > 1  # it does sample


def test_stop_strings_finish_the_request_and_free_its_blocks(checkpoint):
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = llm.generate("import os", params)[0].outputs[0]
    stop = full.text[6:9]
    index = full.text.index(stop)
    out = llm.generate("import os", params.replace(stop=("@@", stop)))[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (full.text[:index], "stop", stop)
    assert len(out.token_ids) < 20
    assert llm.engine.kv.usage == 0.0
    assert not llm.engine.has_unfinished_requests()


def test_stop_token_text_is_not_in_the_output(checkpoint):
    llm = LLM(str(checkpoint("llama")), num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = llm.generate("import os", params)[0].outputs[0]
    stop_id = full.token_ids[3]
    out = llm.generate("import os", params.replace(stop_token_ids=(stop_id,)))[0].outputs[0]
    assert out.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    assert out.text == llm.get_tokenizer().decode(out.token_ids[:-1])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -3.0),
        ("repetition_penalty", 0.0),
        ("min_tokens", 17),
        ("logprobs", -1),
        ("stop", ("",)),
        ("logit_bias", {1: math.nan}),
    ],
)
def test_bad_values_name_the_parameter(field, value):
    with pytest.raises(ValueError, match=f"invalid {field}"):
        SamplingParams(**{field: value})
