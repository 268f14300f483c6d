"""The batch sampler: filters, seeds, and agreement with the distribution."""

import torch

from kvserve.engine.sampler import Sampler

from factories import make_request

LOGITS = torch.tensor([3.0, 2.0, 1.0, 0.0])  # softmax ≈ .644 .237 .087 .032


def draw(params: dict, rows: int = 400, seed_base: int | None = None) -> torch.Tensor:
    requests = [
        make_request(2, seed=None if seed_base is None else seed_base + i, **params)
        for i in range(rows)
    ]
    return torch.tensor(Sampler()(LOGITS.repeat(rows, 1), requests).token_ids)


def test_greedy_rows_take_the_argmax_next_to_sampled_rows():
    logits = torch.tensor([[0.0, 5.0, 1.0], [9.0, 0.0, 0.0]])
    requests = [make_request(2, temperature=0), make_request(2, temperature=1.0, top_k=1)]
    assert Sampler()(logits, requests).token_ids == [1, 0]


def test_top_k_top_p_and_min_p_restrict_the_support():
    torch.manual_seed(0)
    assert set(draw({"temperature": 1.0, "top_k": 2}).tolist()) == {0, 1}
    assert set(draw({"temperature": 1.0, "top_p": 0.7}).tolist()) == {0, 1}
    assert set(draw({"temperature": 1.0, "top_p": 0.9}).tolist()) == {0, 1, 2}
    assert set(draw({"temperature": 1.0, "min_p": 0.3}).tolist()) == {0, 1}
    assert set(draw({"temperature": 1.0, "top_k": 1}).tolist()) == {0}


def test_a_top_p_that_rounds_to_zero_keeps_the_top_token():
    logits = torch.tensor([[0.0, 1.0, 7.0, 2.0]])
    request = make_request(2, temperature=1.0, top_p=5e-324)  # 0 in float32
    assert Sampler()(logits, [request]).token_ids == [2]


def test_frequencies_follow_the_softmax():
    torch.manual_seed(0)
    counts = torch.bincount(draw({"temperature": 1.0}, rows=20000), minlength=4)
    assert torch.allclose(counts / 20000, LOGITS.softmax(0), atol=0.015)
    hot = torch.bincount(draw({"temperature": 2.0}, rows=20000), minlength=4)
    assert torch.allclose(hot / 20000, (LOGITS / 2).softmax(0), atol=0.015)


def test_a_seed_fixes_the_draw_whatever_else_is_in_the_batch():
    logits = torch.randn(1, 50).repeat(3, 1)
    seeded = [make_request(2, temperature=1.0, seed=42) for _ in range(3)]
    alone = [Sampler()(logits[:1], [r]).token_ids[0] for r in seeded[:1]]
    for _ in range(5):
        alone.append(Sampler()(logits[:1], [seeded[0]]).token_ids[0])
    batched = []
    for _ in range(6):
        others = [make_request(2, temperature=1.0), seeded[1], make_request(2, temperature=0)]
        batched.append(Sampler()(logits, others).token_ids[1])
    assert alone == batched
    assert len(set(alone)) > 1  # the generator advances: not one fixed token
