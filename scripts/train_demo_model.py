"""Build the demo checkpoint that `kvserve serve` serves when no `--model` is given.

One command, deterministic (fixed seeds, sorted inputs, one torch thread by default):

    python scripts/train_demo_model.py --out server/default_model

The training text is what every Python install carries offline: the docstrings of the
standard library's modules, classes and functions, and the language reference topics of
`pydoc_data`, cleaned down to prose paragraphs. Half of the docstrings also become ChatML
exchanges (a question built from the name or the first line, the rest as the answer) so
that chat requests get word-like replies that end with `<|im_end|>`. Output is a standard
Hugging Face directory: a byte-level BPE tokenizer with a ChatML template and a tiny
random-init `LlamaForCausalLM` trained on CPU, stored in bfloat16.
"""

from __future__ import annotations

import argparse
import ast
import math
import pydoc_data.topics
import random
import re
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

SEED = 1234
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SKIPPED_STDLIB_DIRS = {
    "encodings",
    "idle_test",
    "lib2to3",
    "site-packages",
    "test",
    "tests",
    "turtledemo",
}
MAX_ANSWER_CHARS = 600


@dataclass(frozen=True)
class Docstring:
    """A cleaned docstring: `name` is the documented object, `paragraphs` its prose."""

    name: str
    paragraphs: list[str]


def prose_paragraphs(text: str) -> list[str]:
    """Keep the paragraphs of `text` that read as English prose, each reflowed to one line.

    Dropped: code and doctest blocks (indented, `>>>`), headings and their underlines,
    and paragraphs that are mostly symbols or too short to be a sentence.
    """
    kept = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines or lines[0].startswith((" ", "\t")):
            continue
        if any(line.lstrip().startswith((">>>", "...", "::")) for line in lines):
            continue
        lines = [line for line in lines if not re.fullmatch(r"\s*[*=~^\-]{3,}\s*", line)]
        paragraph = " ".join(line.strip() for line in lines)
        visible = paragraph.replace(" ", "")
        letters = sum(ch.isalpha() for ch in visible)
        if len(paragraph.split()) >= 4 and letters >= 0.8 * len(visible):
            kept.append(paragraph)
    return kept


def stdlib_docstrings() -> list[Docstring]:
    """The prose docstrings of the running interpreter's standard library, in path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        if set(path.relative_to(root).parts) & SKIPPED_STDLIB_DIRS:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ):
                continue
            doc = ast.get_docstring(node)
            name = path.stem if isinstance(node, ast.Module) else node.name
            paragraphs = prose_paragraphs(doc) if doc else []
            if paragraphs and not name.startswith("_"):
                found.append(Docstring(name, paragraphs))
    return found


def reference_topics() -> list[Docstring]:
    """The language reference topics that `help()` shows, titled by their first line."""
    found = []
    for key in sorted(pydoc_data.topics.topics):
        text = pydoc_data.topics.topics[key]
        title = text.split("\n", 1)[0].strip()
        paragraphs = prose_paragraphs(text)
        if paragraphs:
            found.append(Docstring(title, paragraphs))
    return found


def clip(paragraphs: list[str]) -> str:
    """The leading paragraphs, cut at a sentence end near `MAX_ANSWER_CHARS`."""
    text = "\n\n".join(paragraphs)
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    cut = text.rfind(". ", 0, MAX_ANSWER_CHARS)
    return text[: cut + 1] if cut > 0 else text[:MAX_ANSWER_CHARS]


def chatml(user: str, assistant: str) -> str:
    return f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{assistant}{IM_END}\n"


def chat_sample(doc: Docstring, rng: random.Random) -> str:
    """One ChatML exchange about `doc`: asked by name, or its first sentence then the rest."""
    first, *rest = doc.paragraphs
    sentences = re.split(r"(?<=\.)\s+", first, maxsplit=1)
    if len(sentences) == 2 and rng.random() < 0.5:
        return chatml(sentences[0], clip([sentences[1], *rest]))
    if rest and rng.random() < 0.5:
        return chatml(first, clip(rest))
    question = rng.choice(
        [
            "What does {} do?",
            "Explain {}.",
            "Tell me about {}.",
            "What is {}?",
            "How do I use {}?",
            "Can you describe {}?",
        ]
    )
    return chatml(question.format(doc.name), clip(doc.paragraphs))


def build_texts(rng: random.Random) -> tuple[list[str], list[str]]:
    """Plain documents (for the tokenizer and the model) and chat samples (model only)."""
    docs = stdlib_docstrings() + reference_topics()
    plain = ["\n\n".join(doc.paragraphs) for doc in docs]
    chats = [chat_sample(doc, rng) for doc in docs if rng.random() < 0.5]
    return plain, chats


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )


def model_config(tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
    )


def token_stream(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """All texts tokenized and concatenated, each followed by `<|endoftext|>`."""
    eos = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def batch(stream: torch.Tensor, size: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - seq_len, (size,), generator=gen)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def mean_loss(model: LlamaForCausalLM, stream: torch.Tensor, seq_len: int) -> float:
    model.eval()
    windows = stream[: len(stream) // seq_len * seq_len].view(-1, seq_len)
    losses = [model(input_ids=w, labels=w).loss.item() for w in windows.split(32)]
    model.train()
    return sum(losses) / len(losses)


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    plain, chats = build_texts(rng)
    tokenizer = train_tokenizer(plain, args.vocab_size)
    texts = plain + chats
    rng.shuffle(texts)
    stream = token_stream(texts, tokenizer)
    held_out = len(stream) // 50
    train_ids, val_ids = stream[:-held_out], stream[-held_out:]
    print(
        f"{len(plain)} documents, {len(chats)} chat samples, "
        f"{len(train_ids)} training tokens, {len(val_ids)} held-out tokens"
    )

    config = model_config(tokenizer)
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f}M parameters")
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1
    )
    gen = torch.Generator().manual_seed(SEED)
    model.train()
    started = time.monotonic()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, warmup=args.steps // 20)
        ids = batch(train_ids, args.batch_size, args.seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == args.steps - 1:
            elapsed = time.monotonic() - started
            print(f"step {step:5d}  loss {loss.item():.3f}  {elapsed:6.0f}s", flush=True)

    val_loss = mean_loss(model, val_ids, args.seq_len)
    print(f"final train loss {loss.item():.3f}, held-out loss {val_loss:.3f}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(
        eos_token_id=[config.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)],
        pad_token_id=config.pad_token_id,
    ).save_pretrained(out)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"saved {out} ({size / 1e6:.2f} MB)")
    print_samples(model, tokenizer)


@torch.no_grad()
def print_samples(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast) -> None:
    """Greedy replies to one completion prompt and one chat turn, to eyeball the result."""
    model.eval()
    stop = [tokenizer.convert_tokens_to_ids(token) for token in (ENDOFTEXT, IM_END)]
    chat = [{"role": "user", "content": "What does the open function do?"}]
    prompts = [
        tokenizer("Return the number of", return_tensors="pt")["input_ids"],
        tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"],
    ]
    for ids in prompts:
        out = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=stop)
        print(repr(tokenizer.decode(out[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="server/default_model")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; one is several times faster than two on a busy two-core machine",
    )
    train(parser.parse_args())


if __name__ == "__main__":
    main()
