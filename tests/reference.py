"""Greedy references from transformers, and the proof that a divergence is a tie."""

import functools

import torch
from transformers import AutoModelForCausalLM

TIE_TOLERANCE = 1e-4


@functools.cache
def hf_model(path: str):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(path: str, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers' greedy continuation with EOS ignored (not suppressed)."""
    return list(_hf_greedy(path, tuple(prompt), max_tokens))


@functools.cache
def _hf_greedy(path: str, prompt: tuple[int, ...], max_tokens: int) -> tuple[int, ...]:
    with torch.no_grad():
        out = hf_model(path).generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=None,
        )
    return tuple(out[0, len(prompt) :].tolist())


def assert_greedy_match(path: str, prompt: list[int], expected: list[int], got: list[int]):
    """Equal token for token, or equal up to a position where transformers' own
    top-two logits are within TIE_TOLERANCE and ``got`` took the other one."""
    if got == expected:
        return
    assert len(got) == len(expected), (len(got), len(expected))
    i = next(i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b)
    with torch.no_grad():
        logits = hf_model(path)(torch.tensor([prompt + expected[:i]])).logits[0, -1]
    gap = (logits[expected[i]] - logits[got[i]]).abs().item()
    assert gap <= TIE_TOLERANCE, (
        f"diverged at output {i}: expected {expected[i]}, got {got[i]}, logit gap {gap:.3g} "
        "is no tie"
    )
