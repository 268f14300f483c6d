"""Sampling with drafts (n-gram, or a draft model's greedy ones) leaves the output
distribution the target model's: on a model of 8 tokens, 4000 seeded samples of the 2nd and
3rd output tokens (the first and second drafted positions) against the exact marginals
transformers computes (float32), by a chi-square test."""

import pytest
import torch

from kvserve import SamplingParams
from kvserve.engine.llm import LLM

from checkpoints import build_checkpoint
from reference import hf_model

VOCAB = 8
SAMPLES = 4000
# The chi-square statistic's 0.999 quantile for 7 degrees of freedom (8 tokens): a sampler
# that is right passes with probability 0.999. The samples are seeded: the test is
# deterministic, and a wrong rule (e.g. keeping every draft, or the target's token only where
# a draft was rejected) lands far above it.
CHI2_BOUND = 24.32
# every token occurs in the prompt, followed by others: each output token finds drafts
PROMPT = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5, 7, 0, 2, 6, 4, 7]


def target_marginals(path: str) -> list[torch.Tensor]:
    """The distributions of output tokens 1, 2 and 3 at temperature 1, summed over the
    tokens before them."""
    model = hf_model(path)
    with torch.no_grad():
        first = model(torch.tensor([PROMPT])).logits[0, -1].softmax(-1)
        pairs = torch.tensor([[*PROMPT, a] for a in range(VOCAB)])
        second = model(pairs).logits[:, -1].softmax(-1)  # [a, b]
        triples = torch.tensor([[*PROMPT, a, b] for a in range(VOCAB) for b in range(VOCAB)])
        third = model(triples).logits[:, -1].softmax(-1).view(VOCAB, VOCAB, VOCAB)
    joint2 = first[:, None] * second
    return [first, joint2.sum(0), (joint2[:, :, None] * third).sum((0, 1))]


def chi_square(tokens: list[int], expected: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    wanted = expected.double() * len(tokens)
    return float(((counts - wanted) ** 2 / wanted).sum())


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_drafted_positions_follow_the_target_distribution(tmp_path, method):
    path = str(build_checkpoint("llama", tmp_path / "v8", vocab_size=VOCAB))
    spec = {"method": method, "num_speculative_tokens": 2}
    if method == "ngram":
        spec["prompt_lookup_min"] = 1
    else:  # another random model of the same 8 tokens
        spec["model"] = str(build_checkpoint("llama", tmp_path / "draft", seed=1, vocab_size=VOCAB))
    llm = LLM(
        path, dtype="float32", num_kv_blocks=2048, block_size=4, max_num_seqs=256,
        speculative_config=spec,
    )  # fmt: skip
    params = [
        SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=i)
        for i in range(SAMPLES)
    ]
    outputs = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * SAMPLES, params)]
    stats = llm.engine.speculator.stats
    assert stats.num_accepted_tokens_per_pos[0] > 100 and stats.num_accepted_tokens_per_pos[1] > 0
    marginals = target_marginals(path)
    for position in (1, 2):
        found = chi_square([tokens[position] for tokens in outputs], marginals[position])
        assert found < CHI2_BOUND, (position, found)
