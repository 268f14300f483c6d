"""The last decoder layer runs its output projection and MLP only on the rows whose logits
are read (the sampled tokens, the prompt-logprob positions); every row's key and value
still reach the cache (test_engine_matches_transformers: the tokens stay those of
transformers, chunked prefill and prompt logprobs included)."""

import torch

from kvserve import SamplingParams
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def mlp_rows_per_step(engine: LLMEngine) -> list[tuple[int, int]]:
    """Run the engine dry; per step, the rows the first and the last layer's MLP saw."""
    seen: list[int] = []
    layers = engine.runner.model.layers
    hooks = [
        layer.mlp.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
        for layer in (layers[0], layers[-1])
    ]
    steps = []
    try:
        while engine.has_unfinished_requests():
            engine.step()
            steps.append((seen[0], seen[1]))
            seen.clear()
    finally:
        for hook in hooks:
            hook.remove()
    return steps


def test_only_the_read_rows_pass_the_last_layers_mlp(checkpoint):
    path = str(checkpoint("llama"))
    # eager: the hooks see modules run, and a replayed decode step runs none
    config = EngineConfig(
        model=path, num_kv_blocks=64, max_num_batched_tokens=8, enforce_eager=True
    )
    engine = LLMEngine(config)
    prompts = {"a": list(range(3, 23)), "b": list(range(40, 45)), "c": list(range(50, 56))}
    engine.add_request("a", prompts["a"], GREEDY)
    assert mlp_rows_per_step(engine) == [
        (8, 0),  # chunks of a's prompt: no logits, no row out of the last layer
        (8, 0),
        (4, 1),  # the last chunk: its last row samples
        (1, 1),  # decodes: every row
        (1, 1),
    ]
    engine.add_request("b", prompts["b"], GREEDY)
    engine.add_request("c", prompts["c"], GREEDY.replace(prompt_logprobs=0))
    assert mlp_rows_per_step(engine) == [
        (8, 4),  # b's prompt (its last row samples) and c's first 3 tokens (each scores the next)
        (4, 4),  # b decodes, c's last 3 tokens (2 score, the last samples): every row, reordered
        (2, 2),
        (1, 1),  # b is done
    ]


def test_the_rows_out_equal_the_same_rows_of_a_full_pass(checkpoint):
    engine = LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64))
    runner = engine.runner
    engine.add_request("a", list(range(3, 23)), GREEDY)
    engine.add_request("b", list(range(40, 45)), GREEDY)
    out = engine.scheduler.schedule()
    inputs = runner.prepare(out)
    assert not inputs.every_row and inputs.logits_indices.tolist() == [19, 24]
    with torch.inference_mode():
        full = runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)
        rows = runner.model(
            inputs.input_ids,
            inputs.positions,
            runner.kv_caches,
            inputs.meta,
            inputs.logits_indices,
        )
    torch.testing.assert_close(rows, full[inputs.logits_indices], rtol=1e-5, atol=1e-5)
