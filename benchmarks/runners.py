"""One engine's timed run of the workload, in a process of its own.

Usage: python runners.py SPEC.json RESULT.json (the driver, throughput.py, writes the spec).
Each engine's imports live inside its function: this file also runs under vLLM's own
virtual environment, which has neither kvserve nor the benchmark's transformers.
"""

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Spec = dict[str, Any]
Outputs = list[list[int]]


def _load_hf_model(spec: Spec) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[spec["dtype"]]
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype)
    model.eval()
    # EOS ignored: generation never stops early and never suppresses a token.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _static_batches(model: Any, prompts: Outputs, max_tokens: int, batch_size: int) -> Outputs:
    """`generate` on batches of `batch_size` requests in arrival order, left padded."""
    import torch

    outputs: Outputs = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=False
            )
        outputs += out[:, width:].tolist()
    return outputs


def run_hf_single(spec: Spec) -> dict[str, Any]:
    model = _load_hf_model(spec)
    return _timed(spec, lambda prompts, n: _static_batches(model, prompts, n, 1))


def run_hf_static(spec: Spec) -> dict[str, Any]:
    model = _load_hf_model(spec)
    size = spec["batch_size"]
    return _timed(spec, lambda prompts, n: _static_batches(model, prompts, n, size))


def run_hf_continuous(spec: Spec) -> dict[str, Any]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = _load_hf_model(spec)
    # Sized explicitly: by default it sizes its cache for a GPU. No block sharing (prefix
    # caching off, as for every engine here).
    cb_config = ContinuousBatchingConfig(
        page_size=256, num_blocks=512, max_batch_tokens=2048, allow_block_sharing=False
    )

    def generate(prompts: Outputs, max_tokens: int) -> Outputs:
        config = GenerationConfig(
            max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
        )
        results = model.generate_batch(
            prompts, generation_config=config, continuous_batching_config=cb_config
        )
        return [list(r.generated_tokens) for r in results.values()]

    return _timed(spec, generate)


def run_kvserve(spec: Spec) -> dict[str, Any]:
    from kvserve import LLM, SamplingParams

    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        enable_prefix_caching=False,
        max_model_len=spec["max_model_len"],
    )

    def generate(prompts: Outputs, max_tokens: int) -> Outputs:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return [list(r.outputs[0].token_ids) for r in llm.generate(prompts, params)]

    result = _timed(spec, generate)
    result["decode_step_ms"] = _single_stream_step_ms(llm.engine, spec)
    result["peak_rss_mib"] = _peak_rss_mib()
    return result


def _peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``): the model, its KV cache, the run."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def _single_stream_step_ms(engine: Any, spec: Spec) -> float:
    """Median time of one decode step with a single running request (its prompt prefilled)."""
    from kvserve import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=spec["decode_steps"] + 1, ignore_eos=True)
    engine.add_request("single-stream", spec["single_prompt"], params)
    engine.step()  # the prefill
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def run_vllm(spec: Spec) -> dict[str, Any]:
    """vLLM's ``LLM.generate``; with ``spec["lora"]`` (lora_cpu.py: ``max_loras``,
    ``max_lora_rank`` and ``adapters``, each ``[name, id, path]`` or None for the base
    model), LoRA on and request i under ``adapters[i % len(adapters)]``."""
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    lora = spec.get("lora")
    options = {}
    adapters: list[Any] = []
    if lora is not None:
        options = {
            "enable_lora": True,
            "max_loras": lora["max_loras"],
            "max_lora_rank": lora["max_lora_rank"],
        }
        adapters = [a and LoRARequest(*a) for a in lora["adapters"]]
    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        enable_prefix_caching=False,
        max_model_len=spec["max_model_len"],
        seed=0,
        **options,
    )

    def generate(prompts: Outputs, max_tokens: int) -> Outputs:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        token_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        per_prompt = [adapters[i % len(adapters)] for i in range(len(prompts))] if lora else None
        results = llm.generate(token_prompts, params, use_tqdm=False, lora_request=per_prompt)
        return [list(r.outputs[0].token_ids) for r in results]

    return _timed(spec, generate) | {"version": vllm.__version__}


def _timed(spec: Spec, generate: Callable[[Outputs, int], Outputs]) -> dict[str, Any]:
    """Warm up on the warm-up prompts (a few tokens each), then time the whole workload once."""
    generate(spec["warmup_prompts"], 4)
    start = time.perf_counter()
    outputs = generate(spec["prompts"], spec["max_tokens"])
    wall = time.perf_counter() - start
    return {"wall_s": wall, "output_tokens": sum(len(o) for o in outputs), "outputs": outputs}


RUNNERS: dict[str, Callable[[Spec], dict[str, Any]]] = {
    "kvserve": run_kvserve,
    "vllm": run_vllm,
    "hf_single": run_hf_single,
    "hf_static": run_hf_static,
    "hf_continuous": run_hf_continuous,
}


def main() -> None:
    spec_path, result_path = sys.argv[1:3]
    with open(spec_path) as f:
        spec = json.load(f)
    result = RUNNERS[spec["engine"]](spec)
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
