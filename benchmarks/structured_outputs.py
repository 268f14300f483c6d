"""Grammar libraries for structured outputs, measured on this CPU; then kvserve's cost.

    python benchmarks/structured_outputs.py [--libraries xgrammar llguidance outlines_core]
                                            [--engine] [--out FILE]

Part 1, per library: the time to make its tokenizer view (once per model), to compile a
realistic JSON schema (nested objects, enums, arrays, strings, numbers; fresh compiler, no
cache), and per token of a valid instance (173 tokens): fill the vocabulary bitmask, then
advance the matcher by the token (the work the engine does per constrained row per step).
The tokenizer is a 32000-token byte-level BPE trained on the standard library's sources
(the throughput benchmark's word-level tokenizer cannot spell JSON: no token holds a brace).

llguidance and outlines-core are not kvserve dependencies: install them for the comparison
(``pip install llguidance==1.9.1 outlines-core==0.2.14``), or pass ``--libraries xgrammar``.

Part 2 (``--engine``, kvserve with the chosen library): the 134M benchmark model with that
tokenizer, a W1-style batch of 32 requests (prompts 32-512 tokens, 48 output tokens, greedy,
EOS ignored) with none and with a quarter constrained to the schema, in alternating
rounds, with the engine's step time and the sampler's, masks included.
"""

import argparse
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from machine import describe
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 32000
EOS_TOKEN = "<|endoftext|>"

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "maxLength": 64},
        "status": {"enum": ["active", "suspended", "deleted"]},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["DE", "FR", "US", "JP"]},
            },
            "required": ["street", "city", "country"],
            "additionalProperties": False,
        },
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                    "gift": {"type": "boolean"},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["id", "name", "status", "tags", "address", "orders"],
    "additionalProperties": False,
}
INSTANCE = {
    "id": 48213,
    "name": "Ada Lovelace",
    "status": "active",
    "score": 97.25,
    "tags": ["mathematics", "engines", "poetry"],
    "address": {"street": "12 St James's Square", "city": "London", "country": "US"},
    "orders": [
        {"sku": "AE-1843", "quantity": 2, "price": 19.99, "gift": True},
        {"sku": "NOTE-G", "quantity": 1, "price": 4.5},
        {"sku": "BERNOULLI-7", "quantity": 12, "price": 0.75, "gift": False},
    ],
}


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A 32000-token byte-level BPE trained on the standard library's top-level modules."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train([str(f) for f in sorted(stdlib.glob("*.py"))], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )


class Library:
    """One library behind the three calls measured: setup, compile, and a matcher's
    fill-and-advance."""

    name: str

    def setup(self, tokenizer: PreTrainedTokenizerFast) -> None: ...

    def compile(self, schema: str) -> object: ...

    def matcher(self, compiled: object) -> Callable[[torch.Tensor, int], None]:
        """A fresh matcher as ``step(bitmask, token)``: fill ``bitmask`` (int32 words,
        one bit per token), then advance by ``token``."""
        ...


class XGrammar(Library):
    name = "xgrammar 0.2.9"

    def setup(self, tokenizer):
        import xgrammar

        self.xgr = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB_SIZE)

    def compile(self, schema):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return compiler.compile_json_schema(schema)

    def matcher(self, compiled):
        matcher = self.xgr.GrammarMatcher(compiled)

        def step(bitmask, token):
            matcher.fill_next_token_bitmask(bitmask)
            assert matcher.accept_token(token)

        return step


class LLGuidance(Library):
    name = "llguidance 1.9.1"

    def setup(self, tokenizer):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=VOCAB_SIZE)

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return grammar

    def matcher(self, compiled):
        matcher = self.llg.LLMatcher(self.tokenizer, compiled)

        def step(bitmask, token):
            self.llg.torch.fill_next_token_bitmask(matcher, bitmask)
            assert matcher.consume_token(token), matcher.get_error()

        return step


class OutlinesCore(Library):
    name = "outlines-core 0.2.14"

    def setup(self, tokenizer):
        import outlines_core

        self.oc = outlines_core
        byte_of = {c: b for b, c in _byte_level_alphabet().items()}
        tokens: dict[bytes, list[int]] = {}
        eos = tokenizer.eos_token_id
        for text, token_id in tokenizer.get_vocab().items():
            if token_id != eos:
                tokens.setdefault(bytes(byte_of[c] for c in text), []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(eos, tokens)

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(schema)
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled):
        guide = self.oc.Guide(compiled)

        def step(bitmask, token):
            guide.write_mask_into(bitmask.data_ptr(), bitmask.numel(), bitmask.element_size())
            guide.advance(token, return_tokens=False)

        return step


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte → printable character map, as the ByteLevel pre-tokenizer writes tokens."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


LIBRARIES = {"xgrammar": XGrammar, "llguidance": LLGuidance, "outlines_core": OutlinesCore}


def allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)


def measure_library(
    lib: Library, tokenizer: PreTrainedTokenizerFast, rounds: int, compiles: int
) -> dict:
    schema = json.dumps(SCHEMA)
    start = time.perf_counter()
    lib.setup(tokenizer)
    setup_s = time.perf_counter() - start
    compile_s = []
    for _ in range(compiles):
        start = time.perf_counter()
        compiled = lib.compile(schema)
        compile_s.append(time.perf_counter() - start)
    tokens = tokenizer.encode(json.dumps(INSTANCE))
    bitmask = torch.zeros((1, (VOCAB_SIZE + 31) // 32), dtype=torch.int32)
    per_token = []
    for _ in range(rounds):
        step = lib.matcher(compiled)
        for token in tokens:
            start = time.perf_counter()
            step(bitmask, token)
            per_token.append(time.perf_counter() - start)
            assert allowed(bitmask, token), f"{lib.name} masked out a valid token"
    per_token.sort()
    return {
        "library": lib.name,
        "setup_s": setup_s,
        "compile_ms": statistics.median(compile_s) * 1e3,
        "tokens": len(tokens),
        "mean_us": statistics.fmean(per_token) * 1e6,
        "p50_us": per_token[len(per_token) // 2] * 1e6,
        "p99_us": per_token[int(len(per_token) * 0.99)] * 1e6,
    }


def library_table(rows: list[dict]) -> list[str]:
    lines = [
        "| library | tokenizer setup s | schema compile ms (median) | instance tokens "
        "| fill + advance µs/token: mean | p50 | p99 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['library']} | {r['setup_s']:.2f} | {r['compile_ms']:.1f} | {r['tokens']} "
            f"| {r['mean_us']:.1f} | {r['p50_us']:.1f} | {r['p99_us']:.1f} |"
        )
    return lines


def machine() -> str:
    return f"- {describe()}; /proc/loadavg: {Path('/proc/loadavg').read_text().strip()}"


class Timed:
    """Wraps a callable and sums the seconds its calls take."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def engine_run(llm, workload, constrained_every: int | None) -> dict:
    """One timed ``generate`` of the workload; every ``constrained_every``-th request
    constrained to SCHEMA (its grammar compiled beforehand, as the server does)."""
    import kvserve.engine.sampler as sampler_module
    from kvserve import SamplingParams
    from kvserve.engine.structured.spec import OutputConstraint

    constraint = OutputConstraint("json", json.dumps(SCHEMA))
    llm.engine.grammars.compile(constraint)
    plain = SamplingParams(temperature=0, max_tokens=workload.max_tokens, ignore_eos=True)
    params = [
        plain.replace(constraint=constraint)
        if constrained_every and i % constrained_every == 0
        else plain
        for i in range(len(workload.prompts))
    ]
    engine = llm.engine
    step, sample = Timed(engine.step), Timed(engine.sampler)
    masks = Timed(sampler_module.apply_grammar_masks)
    engine.step, engine.sampler, sampler_module.apply_grammar_masks = step, sample, masks
    try:
        start = time.perf_counter()
        outputs = llm.generate(workload.prompts, params)
        wall = time.perf_counter() - start
    finally:
        del engine.step  # the class's method again
        engine.sampler = sample.fn
        sampler_module.apply_grammar_masks = masks.fn
    constrained = [o.outputs[0] for o, p in zip(outputs, params, strict=True) if p.constraint]
    valid = sum(1 for c in constrained if c.finish_reason == "stop" and _validates(c.text))
    grammar = engine.grammars.compile(constraint)
    cut = sum(1 for c in constrained if c.finish_reason == "length" and _prefix(grammar, c))
    return {
        "wall_s": wall,
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "steps": step.calls,
        "step_ms": step.seconds / step.calls * 1e3,
        "sampler_ms": sample.seconds / max(sample.calls, 1) * 1e3,
        "mask_ms": masks.seconds / max(masks.calls, 1) * 1e3,
        "constrained": len(constrained),
        "valid": valid,
        "cut": cut,
        "load": os.getloadavg()[0],
    }


def _prefix(grammar, completion) -> bool:
    """Whether the grammar takes every token of the (cut) completion."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(grammar)
    return all(matcher.accept_token(t) for t in completion.token_ids)


def _validates(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def engine_tables(workdir: Path, tokenizer: PreTrainedTokenizerFast, args) -> list[str]:
    """W1-style throughput with none and a quarter of the requests constrained."""
    from checkpoint import build_checkpoint
    from throughput import Workload

    from kvserve import LLM

    ckpt = build_checkpoint(workdir / "model", torch.float32)
    tokenizer.save_pretrained(ckpt.directory)  # byte-level BPE in place of the word-level one
    llm = LLM(str(ckpt.directory), max_model_len=1024, enable_prefix_caching=False)
    workload = Workload.random(args.requests, 32, 512, args.max_tokens, seed=0)
    warmup = Workload.random(4, 16, 64, 4, seed=1)
    runs = []  # alternating, so that a change in the machine's load hits both alike
    for round_ in range(1, args.rounds_engine + 1):
        for name, every in (("none constrained", None), ("1 in 4 constrained", 4)):
            engine_run(llm, warmup, every)
            runs.append((f"{name}, round {round_}", engine_run(llm, workload, every)))
            print(*runs[-1], file=sys.stderr, flush=True)
    lines = [
        f"kvserve `LLM.generate`, 134M Llama (fp32) with the BPE tokenizer: {args.requests} "
        f"requests, prompts 32-512 random ids, {args.max_tokens} output tokens max, greedy, "
        "EOS ignored (a constrained request ends when its JSON is complete), prefix caching off.",
        "",
        "| run | wall s | out tokens | out tok/s | steps | step ms | sampler ms/step "
        "| masks ms/step (steps with a constrained row) | constrained: complete and valid "
        "| cut at max tokens, valid prefix | load after |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in runs:
        lines.append(
            f"| {name} | {r['wall_s']:.1f} | {r['output_tokens']} "
            f"| {r['output_tokens'] / r['wall_s']:.1f} | {r['steps']} | {r['step_ms']:.1f} "
            f"| {r['sampler_ms']:.2f} | {r['mask_ms']:.2f} | {r['valid']}/{r['constrained']} "
            f"| {r['cut']}/{r['constrained']} "
            f"| {r['load']:.2f} |"
        )
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--libraries", nargs="+", choices=list(LIBRARIES), default=list(LIBRARIES))
    p.add_argument("--rounds", type=int, default=5, help="matchers run over the instance")
    p.add_argument("--compiles", type=int, default=3)
    p.add_argument("--engine", action="store_true", help="also time kvserve (part 2)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rounds-engine", type=int, default=2, help="alternating engine runs")
    p.add_argument("--out", type=Path, help="write the tables to this markdown file too")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    lines = [f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", machine(), ""]
    start = time.perf_counter()
    tokenizer = bpe_tokenizer()
    print(f"tokenizer trained in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    rows = []
    for name in args.libraries:
        rows.append(measure_library(LIBRARIES[name](), tokenizer, args.rounds, args.compiles))
        print(rows[-1], file=sys.stderr, flush=True)
    lines += library_table(rows)
    if args.engine:
        with tempfile.TemporaryDirectory() as workdir:
            lines += ["", *engine_tables(Path(workdir), tokenizer, args)]
    lines += ["", machine()]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
