"""Batched LoRA in the engine: greedy tokens equal transformers + peft with the adapter
merged, for batches mixing adapters and the base model, with chunked prefill and prefix
caching on; adapters swapped least-recently-used through fewer slots; two adapters never
share cached blocks."""

import random

import pytest
from joined_outputs import JoinedOutputs

from kvserve import LoRARequest, SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine

from audit import assert_all_released, audit_blocks
from lora_adapters import build_adapter, merged_checkpoint
from reference import assert_greedy_match, hf_greedy

MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def adapters(checkpoint, family, tmp_path_factory):
    """Base checkpoint, and three adapters (ranks 8, 16, 8; all seven targets) with their
    merged references: name → (LoRARequest, merged checkpoint)."""
    base = checkpoint(family)
    root = tmp_path_factory.mktemp(f"lora-{family}")
    built = {}
    for i, (name, rank) in enumerate([("a", 8), ("b", 16), ("c", 8)], start=1):
        adapter = build_adapter(base, root / name, rank, seed=i)
        merged = merged_checkpoint(base, adapter, root / f"{name}-merged")
        built[name] = (LoRARequest(name, i, str(adapter)), merged)
    return base, built


def prompts(seed: int) -> list[list[int]]:
    """Nine prompts of 20..50 tokens, in threes that share a 20-token prefix (so that the
    prefix cache would hand one adapter's blocks to another if the key let it)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 500) for _ in range(20)] for _ in range(3)]
    return [p + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 30))] for p in prefixes * 3]


def run(engine: LLMEngine, batch: list[tuple[list[int], LoRARequest | None]]) -> list[list[int]]:
    for i, (prompt, lora) in enumerate(batch):
        engine.add_request(str(i), prompt, GREEDY, lora_request=lora)
    seen, results = JoinedOutputs(), {}
    most_adapters = 0
    while engine.has_unfinished_requests():
        for out in seen.add(engine.step()):
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        running = {r.lora_name for r in engine.scheduler.running if r.lora is not None}
        most_adapters = max(most_adapters, len(running))
        audit_blocks(engine)
    assert most_adapters <= engine.config.max_loras
    assert_all_released(engine)
    return [results[str(i)] for i in range(len(batch))]


def check(base, built, batch, got) -> None:
    for (prompt, lora), tokens in zip(batch, got, strict=True):
        reference = str(base if lora is None else built[lora.lora_name][1])
        expected = hf_greedy(reference, prompt, MAX_TOKENS)
        if lora is not None:  # the adapter changes the tokens: the test can tell
            assert expected != hf_greedy(str(base), prompt, MAX_TOKENS)
        assert_greedy_match(reference, prompt, expected, tokens)


def test_a_batch_mixing_two_adapters_and_the_base_model_equals_the_merged_models(adapters):
    base, built = adapters
    loras = [None, built["a"][0], built["b"][0]]
    batch = [(p, loras[i % 3]) for i, p in enumerate(prompts(0))]
    engine = LLMEngine(
        EngineConfig(
            model=str(base),
            enable_lora=True,
            max_loras=2,
            num_kv_blocks=128,
            max_num_batched_tokens=32,  # chunked prefill
            enable_prefix_caching=True,
        )
    )
    got = run(engine, batch)
    check(base, built, batch, got)
    # the same prompts again: prefix-cache hits, each under its own adapter's key
    again = run(engine, batch)
    assert again == got
    assert engine.stats.prefix_cache_hits > 0


def test_three_adapters_through_one_slot_are_swapped_least_recently_used(adapters):
    base, built = adapters
    loras = [built["a"][0], built["b"][0], built["c"][0], None]
    batch = [(p, loras[i % 4]) for i, p in enumerate(prompts(1))]
    engine = LLMEngine(
        EngineConfig(
            model=str(base), enable_lora=True, max_loras=1, max_cpu_loras=2, num_kv_blocks=128
        )
    )
    got = run(engine, batch)  # asserts at most one adapter runs at a time
    check(base, built, batch, got)
    slots = engine.runner.lora
    assert slots is not None and slots.loads >= 3
    assert len(engine.loras.loaded) == 2  # max_cpu_loras: the least recently used was dropped


def test_requests_under_an_unloaded_adapter_finish_under_it(adapters):
    base, built = adapters
    lora, merged = built["a"]
    engine = LLMEngine(EngineConfig(model=str(base), enable_lora=True, num_kv_blocks=64))
    prompt = prompts(2)[0]
    engine.add_request("0", prompt, GREEDY, lora_request=lora)
    seen, tokens = JoinedOutputs(), None
    seen.add(engine.step())
    engine.remove_lora("a")
    assert engine.list_loras() == []
    while engine.has_unfinished_requests():
        for out in seen.add(engine.step()):
            tokens = out.outputs[0].token_ids
    assert_greedy_match(str(merged), prompt, hf_greedy(str(merged), prompt, MAX_TOKENS), tokens)
    with pytest.raises(KeyError):
        engine.remove_lora("a")
