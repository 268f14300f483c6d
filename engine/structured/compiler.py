"""Output constraints compiled to xgrammar grammars on a thread pool, once per constraint.

xgrammar won the measurement in ``benchmarks/structured_outputs.py`` (the lowest mean
per-token mask time on the 32k-token benchmark tokenizer; see
``benchmarks/results/structured-outputs.md``).
"""

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from kvserve.engine.structured.json_schema import unenforced_keyword
from kvserve.engine.structured.spec import OutputConstraint

# xgrammar's C++ errors start with a time and a source location: not the client's business.
_NOISE = re.compile(r"\[[\d:]+\] \S+:\d+: |Check failed: \(.*?\) is false: ")
MAX_CACHED_GRAMMARS = 512
_KIND_NAMES = {"json": "json schema", "json_object": "json_object", "regex": "regex",
               "choice": "choice", "grammar": "grammar"}  # fmt: skip
# The character classes xgrammar 0.2.9 writes for the characters of a JSON string, bounded
# (minLength/maxLength) and not. Both let UTF-16 surrogates through (3 bytes that are not
# UTF-8, decoded as U+FFFD each), the bounded one raw control characters too (which JSON
# forbids unescaped); _JSON_STRING_CHAR, in place of both, lets neither through.
_STRING_CHARS = (r"[^\"\\\r\n]", r"[^\0-\x1f\"\\\r\n]")
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\r\n\uD800-\uDFFF]"


class InvalidConstraintError(ValueError):
    """The constraint cannot be compiled; the message names the problem for the client."""


def _message(kind: str, exc: Exception) -> str:
    detail = _NOISE.sub("", str(exc)).strip().splitlines()
    return f"invalid {kind}: {detail[0] if detail else type(exc).__name__}"


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF whose root is exactly one of ``choices`` (string literals JSON-escaped, which
    xgrammar's EBNF reads)."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidConstraintError(
            "invalid choice: must be a non-empty list of non-empty strings"
        )
    literals = (json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
    return "root ::= " + " | ".join(literals)


def json_schema_grammar(schema: str) -> str:
    """The EBNF of a JSON schema: compact JSON (no free whitespace, which a model could
    pour out without end), every string valid UTF-8 and free of raw control characters."""
    import xgrammar

    grammar = str(xgrammar.Grammar.from_json_schema(schema, any_whitespace=False))
    for chars in _STRING_CHARS:
        grammar = grammar.replace(chars, _JSON_STRING_CHAR)
    return grammar


class GrammarCompiler:
    """Compiles ``OutputConstraint``s for one tokenizer and caches the results.

    ``submit`` returns at once with a future (the engine thread never waits on a compile;
    the server awaits it wrapped); ``compile`` blocks. Both share one cache keyed by the
    constraint, holding the future itself, so a constraint is compiled once however many
    requests or threads ask; a failed compile is cached too, as its ``InvalidConstraintError``.
    The xgrammar tokenizer view is built on the pool with the first compile: importing
    xgrammar and reading the vocabulary cost a second or more, which a server that never
    sees a constraint should not pay at start.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        pool: Executor | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        # One worker: compiles queue behind each other, never behind the engine thread.
        self._pool = pool or ThreadPoolExecutor(1, thread_name_prefix="kvserve-grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[OutputConstraint, Future] = OrderedDict()
        self._xgr_compiler: Any = None

    def submit(self, constraint: OutputConstraint) -> Future:
        """The compiled grammar of ``constraint``, as a future (done at once when cached)."""
        with self._lock:
            future = self._cache.get(constraint)
            if future is not None:
                self._cache.move_to_end(constraint)
                return future
            future = self._pool.submit(self._compile, constraint)
            self._cache[constraint] = future
            if len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
            return future

    def compile(self, constraint: OutputConstraint) -> Any:
        """Compile (or find) ``constraint``'s grammar; raises ``InvalidConstraintError``."""
        return self.submit(constraint).result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compiler(self) -> Any:
        if self._xgr_compiler is None:
            import xgrammar

            info = xgrammar.TokenizerInfo.from_huggingface(
                self._tokenizer,
                vocab_size=self._vocab_size,
                stop_token_ids=list(self._stop_token_ids),
            )
            self._xgr_compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        return self._xgr_compiler

    def _compile(self, constraint: OutputConstraint) -> Any:
        compiler = self._compiler()
        kind, value = constraint.kind, constraint.value
        try:
            if kind == "json":
                if found := unenforced_keyword(json.loads(value)):
                    raise InvalidConstraintError(
                        f"invalid json schema: unsupported keyword {found}"
                    )
                return compiler.compile_grammar(json_schema_grammar(value))
            if kind == "json_object":
                return compiler.compile_grammar(json_schema_grammar('{"type": "object"}'))
            if kind == "regex":
                return compiler.compile_regex(value)
            if kind == "choice":
                return compiler.compile_grammar(choice_grammar(constraint.choices))
            if kind == "grammar":
                return compiler.compile_grammar(value)
        except InvalidConstraintError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError; json raises ValueError
            raise InvalidConstraintError(_message(_KIND_NAMES[kind], exc)) from None
        raise InvalidConstraintError(f"invalid constraint: unknown kind {kind!r}")
