"""What one engine step costs with and without n-gram speculation, in the engine itself (no
server): SmolLM2-135M-Instruct, float32, one thread, one code-edit request of
spec_decode.py (greedy, EOS ignored). Per step the thread's CPU time (less sensitive than
the wall clock to the other jobs of a shared machine) and the wall time; speculation off
gives the decode step, on the verification step and the tokens it keeps.

    python benchmarks/spec_decode_steps.py [--model DIR] [--rounds 3] [--max-tokens 96]

Run it with another checkout's interpreter (its editable kvserve) for an A/B of two trees,
alternating them; the first line says which tree ran. Not a test.
"""

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch
from gguf_export import export
from spec_decode import code_edit_prompts

import kvserve
from kvserve.engine.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.tokenizer import load_tokenizer
from kvserve.server import smollm2

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
}


def steps(engine: LLMEngine, prompt: list[int], max_tokens: int) -> list[tuple[float, float, int]]:
    """(CPU s, wall s, tokens out) of each step after the request's first (its prefill)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.add_request("r", prompt, params)
    found = []
    while engine.has_unfinished_requests():
        cpu, wall = time.thread_time(), time.perf_counter()
        outputs = engine.step()
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        found.append((cpu, wall, sum(len(o.outputs[0].token_ids) for o in outputs)))
    return found[1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=Path("/tmp/kvserve-smollm2-135m-f32"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args()
    torch.set_num_threads(1)
    if not args.model.exists():
        export(smollm2.fetch(), args.model)
    tree = Path(kvserve.__file__).parent
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"tree {tree} at {commit}")
    tokenizer = load_tokenizer(str(args.model))
    prompt = tokenizer.encode(code_edit_prompts(1)[0], add_special_tokens=False)
    settings = dict(dtype="float32", max_model_len=2048, enable_prefix_caching=False)
    engines = {
        "off": LLMEngine(EngineConfig(model=str(args.model), **settings)),
        "on": LLMEngine(EngineConfig(model=str(args.model), speculative_config=NGRAM, **settings)),
    }
    for name, engine in engines.items():
        steps(engine, prompt, args.max_tokens)  # warm: recordings, allocations
        found = [s for _ in range(args.rounds) for s in steps(engine, prompt, args.max_tokens)]
        cpu = statistics.median(s[0] for s in found) * 1e3
        wall = statistics.median(s[1] for s in found) * 1e3
        tokens = sum(s[2] for s in found)
        per_token = sum(s[0] for s in found) / tokens * 1e3
        print(
            f"speculation {name}: {len(found)} steps, step median {cpu:.1f} ms CPU / {wall:.1f} "
            f"ms wall, {tokens / len(found):.2f} tokens a step, {per_token:.1f} ms CPU a token"
        )
        engine.shutdown()


if __name__ == "__main__":
    main()
