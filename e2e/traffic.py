"""Client traffic of the e2e scenarios: the OpenAI SDK on a fresh connection per request.

A fresh client per request opens a new TCP connection each time, so every request is balanced
anew by kube-proxy (a pooled keep-alive connection would stick to one pod).
"""

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from openai import APIConnectionError, APIStatusError, OpenAI
from openai.types.chat import ChatCompletion
from prometheus_client.parser import text_string_to_metric_families

MODEL = "demo"
REQUEST_TIMEOUT = 120.0


def openai_client(base: str) -> OpenAI:
    """No retries: a refused or failed request must show, not be hidden by the SDK."""
    return OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT)


def chat(base: str, content: str = "Hello", max_tokens: int = 8) -> ChatCompletion:
    with openai_client(base) as ai:
        return ai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens
        )


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    target: str
    started: float
    ended: float = 0.0
    admitted: bool = False
    """The server answered 200 and the stream began; ``refused`` holds why not otherwise."""
    refused: str | None = None
    chunks: int = 0
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    """What broke an admitted stream (a cut), None if it ended with its usage chunk."""

    def complete(self, max_tokens: int) -> bool:
        """Admitted, every token sent, a finish reason, and nothing broke it."""
        return (
            self.admitted
            and self.error is None
            and self.finish_reason == "length"
            and self.completion_tokens == max_tokens
        )


def stream_completion(base: str, target: str, max_tokens: int) -> Stream:
    """Stream ``max_tokens`` tokens (EOS ignored) from ``base``; never raises."""
    result = Stream(target, time.monotonic())
    with openai_client(base) as ai:
        try:
            chunks = ai.completions.create(
                model=MODEL, prompt="Once upon a time", max_tokens=max_tokens, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            )  # fmt: skip
        except APIStatusError as e:
            result.refused = f"HTTP {e.status_code}"
        except APIConnectionError as e:
            result.refused = f"connection: {e.__cause__ or e}"
        else:
            result.admitted = True
            try:
                for chunk in chunks:
                    if chunk.choices:
                        result.chunks += 1
                        result.finish_reason = chunk.choices[0].finish_reason or None
                    if chunk.usage is not None:
                        result.completion_tokens = chunk.usage.completion_tokens
            except Exception as e:  # a cut stream: whatever the transport raised
                result.error = f"{type(e).__name__}: {e}"
    result.ended = time.monotonic()
    return result


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; 0 and the reason when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def metric_sum(exposition: str, family: str) -> float:
    """The sum of every sample of a counter family (``vllm:request_success`` → ``_total``)."""
    for metric in text_string_to_metric_families(exposition):
        if metric.name == family:
            return sum(s.value for s in metric.samples if s.name.endswith("_total"))
    raise AssertionError(f"no metric {family} in the exposition")
