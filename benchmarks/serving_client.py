"""The streaming client of the serving benchmark: one ``POST /v1/completions`` with
``stream: true``, timed chunk by chunk.

Token counting: every request asks for ``stream_options: {include_usage: true,
continuous_usage_stats: true}``, so each chunk carries the running ``usage.completion_tokens``
(kvserve and vLLM both send it); a chunk brings as many tokens as that count grew by, which
may be more than one. A server that sends no running usage gets one token per chunk with
text, and the final usage chunk's count is the request's total.
"""

import json
import time
from dataclasses import dataclass, field

import aiohttp
import numpy as np


@dataclass
class Record:
    """One request's timeline; every time in seconds."""

    workload: str
    target: str
    index: int
    """The request's place in its workload (for multi-turn: conversation × turns + turn)."""
    prompt_tokens: int
    max_tokens: int
    sent: float = 0.0
    """When it was sent, from the start of its workload."""
    chunks: list[tuple[float, int]] = field(default_factory=list)
    """(arrival from `sent`, tokens it brought) for each chunk that brought tokens."""
    end: float = 0.0
    """When the stream ended (``[DONE]``), from `sent`."""
    output_tokens: int = 0
    text: str = ""
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.chunks[0][0]

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: a chunk after the first that brought k tokens after a gap g
        counts as k gaps of g / k (the first chunk's extra tokens count as none)."""
        gaps = []
        for (before, _), (at, k) in zip(self.chunks, self.chunks[1:], strict=False):
            gaps += [(at - before) / k] * k
        return gaps

    @property
    def itl_p99(self) -> float:
        gaps = self.itl
        return float(np.percentile(gaps, 99)) if gaps else 0.0

    @property
    def multi_token_chunks(self) -> int:
        return sum(1 for _, k in self.chunks if k > 1)


async def stream_completion(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], record: Record
) -> None:
    """Send `prompt` greedy with EOS ignored and fill `record` as the stream comes; an HTTP
    error, an error event or a stream without tokens sets ``record.error``."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": record.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    began = time.perf_counter()
    counted = 0
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                at = time.perf_counter() - began
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = json.dumps(chunk["error"])[:200]
                    return
                usage = chunk.get("usage") or {}
                if not chunk.get("choices"):  # the usage chunk at the end
                    record.output_tokens = usage.get("completion_tokens", 0)
                    continue
                pieces = [c.get("text") or "" for c in chunk["choices"]]
                record.text += "".join(pieces)
                if "completion_tokens" in usage:
                    brought = usage["completion_tokens"] - counted
                else:
                    brought = sum(1 for p in pieces if p)
                if brought > 0:
                    record.chunks.append((at, brought))
                    counted += brought
    except (aiohttp.ClientError, TimeoutError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:200]
        return
    record.end = time.perf_counter() - began
    record.output_tokens = max(record.output_tokens, counted)
    if not record.chunks:
        record.error = "the stream ended without a token"


PREFIX_COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
"""Prompt tokens looked up in and found in the prefix cache; kvserve exports vLLM's names."""


async def prefix_cache_counts(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """(queries, hits) from ``GET /metrics``, summed over label sets; (0, 0) without them."""
    async with session.get(url + "/metrics") as response:
        text = await response.text() if response.status == 200 else ""
    totals = dict.fromkeys(PREFIX_COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals[PREFIX_COUNTERS[0]], totals[PREFIX_COUNTERS[1]]
