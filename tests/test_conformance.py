"""``kvserve conformance``: kvserve itself passes every check; a server that breaks the
model-server protocol fails the check that names what it breaks, within bounded time."""

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

import msgpack
import pytest
import zmq
from aiohttp import web

from kvserve.server.cli import main

from server_process import API_KEY, ServerProcess, _free_port

GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
PASS_HTTP = [
    "PASS health [required]: GET /health answered 200",
    "PASS models [required]: lists 'm' (1 model)",
    "PASS completions [required]: POST /v1/completions answered 200: a text_completion of "
    "4 tokens (length)",
    "PASS chat [required]: POST /v1/chat/completions answered 200: a chat.completion of "
    "4 tokens (length)",
    "PASS metrics [required]: GET /metrics answered 200 in the Prometheus text format (text/plain)",
]
PASS_GAUGES = [
    "PASS vllm:num_requests_waiting [required]: gauge (TotalQueuedRequests), 1 sample, "
    "a count >= 0",
    "PASS vllm:num_requests_running [required]: gauge (TotalRunningRequests), 1 sample, "
    "a count >= 0",
    "PASS vllm:kv_cache_usage_perc [required]: gauge (KVCacheUtilization), 1 sample, "
    "a fraction in [0, 1]",
]
GOOD_METRICS = {
    "vllm:num_requests_waiting": ("gauge", '{model_name="m"} 0.0'),
    "vllm:num_requests_running": ("gauge", '{model_name="m"} 1.0'),
    "vllm:kv_cache_usage_perc": ("gauge", '{model_name="m"} 0.25'),
    "vllm:cache_config_info": ("gauge", '{block_size="16",num_gpu_blocks="512"} 1.0'),
}
PASS_CACHE_INFO = (
    "PASS vllm:cache_config_info [recommended]: gauge, block_size=16, num_gpu_blocks=512"
)


def exposition(families: dict[str, tuple[str, str]]) -> str:
    """The Prometheus text of ``name -> (type, labels and value)`` (a counter's sample gains
    ``_total``, as on the wire)."""
    lines = []
    for name, (kind, sample) in families.items():
        lines += [f"# TYPE {name} {kind}", name + "_total" * (kind == "counter") + sample]
    return "\n".join(lines) + "\n"


class FakeModelServer:
    """A model server whose answers each test sets; it serves model "m" on loopback and,
    when ``kv_frames`` is set, publishes ``kv_frames(prompt)`` after each completion."""

    def __init__(self) -> None:
        self.health_status = 200
        self.models = ["m"]
        self.metrics = dict(GOOD_METRICS)
        self.kv_frames = None
        self.kv_port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._zmq = zmq.Context()
        self._pub = self._zmq.socket(zmq.PUB)
        self._pub.bind(f"tcp://127.0.0.1:{self.kv_port}")

    def __enter__(self) -> "FakeModelServer":
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self._runner = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._pub.close(0)
        self._zmq.term()

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/health", lambda _: web.json_response({}, status=self.health_status))
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return runner

    async def _list_models(self, _: web.Request) -> web.Response:
        cards = [{"id": m, "object": "model", "owned_by": "fake"} for m in self.models]
        return web.json_response({"object": "list", "data": cards})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=exposition(self.metrics), content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["model"] not in self.models:
            error = {"message": f"model {body['model']} not found", "type": "NotFoundError"}
            return web.json_response({"error": error}, status=404)
        chat = request.path.endswith("chat/completions")
        choice = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": "a b c d"}
        else:
            choice["text"] = "a b c d"
        usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
        kind = "chat.completion" if chat else "text_completion"
        if self.kv_frames is not None and not chat:
            self._pub.send_multipart(self.kv_frames(body["prompt"]))
        return web.json_response(
            {"object": kind, "model": body["model"], "choices": [choice], "usage": usage}
        )


@pytest.fixture
def fake():
    with FakeModelServer() as server:
        yield server


def conformance(capsys, url: str, *flags: str) -> tuple[int, list[str]]:
    status = main(["conformance", url, "--timeout", "10", *flags])
    return status, capsys.readouterr().out.splitlines()


def test_a_conforming_server_passes_every_check(fake, capsys):
    status, lines = conformance(capsys, fake.url)
    assert lines == [
        *PASS_HTTP,
        *PASS_GAUGES,
        PASS_CACHE_INFO,
        "conformance: 8/8 required, 1/1 recommended checks pass",
    ]
    assert status == 0


@pytest.mark.parametrize(
    ("name", "family", "reason"),
    [
        (
            "vllm:num_requests_running",
            None,
            "not on /metrics (the picker reads TotalRunningRequests there)",
        ),
        (
            "vllm:kv_cache_usage_perc",
            ("counter", '{model_name="m"} 0.25'),
            "type counter; the protocol needs a gauge",
        ),
        (
            "vllm:num_requests_waiting",
            ("untyped", '{model_name="m"} 2.0'),
            "type unknown; the protocol needs a gauge",
        ),
        (
            "vllm:kv_cache_usage_perc",
            ("gauge", '{model_name="m"} 37.5'),
            "sample {'model_name': 'm'} = 37.5 is not a fraction in [0, 1]",
        ),
        (
            "vllm:num_requests_waiting",
            ("gauge", '{model_name="m"} 1.5'),
            "sample {'model_name': 'm'} = 1.5 is not a count >= 0",
        ),
    ],
)
def test_a_broken_required_gauge_fails_naming_the_problem(fake, capsys, name, family, reason):
    if family is None:
        del fake.metrics[name]
    else:
        fake.metrics[name] = family
    status, lines = conformance(capsys, fake.url)
    expected = [f"FAIL {name} [required]: {reason}" if g == name else p
                for g, p in zip(GAUGES, PASS_GAUGES, strict=True)]  # fmt: skip
    assert lines[5:8] == expected
    assert lines[-1] == "conformance: 7/8 required, 1/1 recommended checks pass"
    assert status == 1


def test_a_missing_cache_config_info_is_reported_but_only_recommended(fake, capsys):
    del fake.metrics["vllm:cache_config_info"]
    status, lines = conformance(capsys, fake.url)
    assert lines[-2:] == [
        "FAIL vllm:cache_config_info [recommended]: not on /metrics (the prefix-cache scorer "
        "falls back to its own block size and block count)",
        "conformance: 8/8 required, 0/1 recommended checks pass",
    ]
    assert status == 0


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        ('{block_size="16"} 1.0', "no label num_gpu_blocks (labels: block_size)"),
        ('{block_size="0",num_gpu_blocks="512"} 1.0', "block_size='0' is not a positive integer"),
    ],
)
def test_a_cache_config_info_without_usable_labels_fails(fake, capsys, sample, reason):
    fake.metrics["vllm:cache_config_info"] = ("gauge", sample)
    _, lines = conformance(capsys, fake.url)
    assert lines[-2] == f"FAIL vllm:cache_config_info [recommended]: {reason}"


def test_a_model_the_server_does_not_list_fails_and_its_requests_fail(fake, capsys):
    status, lines = conformance(capsys, fake.url, "--model", "other")
    not_found = '{"error": {"message": "model other not found", "type": "NotFoundError"}}'
    assert lines[1:4] == [
        "FAIL models [required]: model 'other' is not listed; listed: m",
        "FAIL completions [required]: POST /v1/completions answered 404 (application/json): "
        f"{not_found!r}",
        "FAIL chat [required]: POST /v1/chat/completions answered 404 (application/json): "
        f"{not_found!r}",
    ]
    assert status == 1


def test_a_health_check_that_is_not_200_fails(fake, capsys):
    fake.health_status = 503
    status, lines = conformance(capsys, fake.url)
    assert lines[0] == (
        "FAIL health [required]: GET /health answered 503 (application/json): '{}'; "
        "a serving server answers 200"
    )
    assert status == 1


def test_an_unreachable_url_fails_every_check_at_once(capsys):
    url = f"http://127.0.0.1:{_free_port()}"
    start = time.monotonic()
    status, lines = conformance(capsys, url, "--kv-events", "tcp://127.0.0.1:1")
    assert time.monotonic() - start < 2
    assert lines[0] == (
        f"FAIL health [required]: no answer: GET {url}/health: [Errno 111] Connection refused"
    )
    names = ["models", "completions", "chat", "metrics", *GAUGES]
    not_run = f"not run: the server at {url} does not answer"
    assert lines[1:-1] == [
        *(f"FAIL {name} [required]: {not_run}" for name in names),
        f"FAIL vllm:cache_config_info [recommended]: {not_run}",
        f"FAIL kv-events [required]: {not_run}",
    ]
    assert lines[-1] == "conformance: 0/9 required, 0/1 recommended checks pass"
    assert status == 1


def test_a_server_that_never_answers_fails_within_the_timeout(capsys):
    with socket.socket() as listener:  # accepts connections (the backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        status = main(["conformance", url, "--timeout", "0.5"])
        elapsed = time.monotonic() - start
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"FAIL health [required]: no answer: GET {url}/health: timed out"
    assert status == 1
    assert elapsed < 2


def _stored_frames(topic: str, hashes_of, parent_of_first=None, as_map=False):
    """A publisher's frames for one batch storing the prompt's full 16-token blocks; with
    ``as_map`` the event is a msgpack map (msgspec's encoding without ``array_like``)."""

    def frames(prompt: list[int]) -> list[bytes]:
        blocks = len(prompt) // 16
        fields = {"block_hashes": hashes_of(blocks), "parent_block_hash": parent_of_first,
                  "token_ids": prompt[: 16 * blocks], "block_size": 16, "lora_id": None,
                  "medium": "GPU"}  # fmt: skip
        event = {"type": "BlockStored"} | fields if as_map else ["BlockStored", *fields.values()]
        payload = msgpack.packb([time.time(), [event], 0])
        return [topic.encode(), (0).to_bytes(8, "big"), payload]

    return frames


def test_kv_events_pass_when_the_stream_stores_the_prompts_blocks(fake, capsys):
    fake.kv_frames = _stored_frames("kv@pod-a@m", lambda n: [bytes([i + 1] * 8) for i in range(n)])
    status, lines = conformance(capsys, fake.url, "--kv-events", f"tcp://127.0.0.1:{fake.kv_port}")
    assert lines[-2:] == [
        "PASS kv-events [required]: 1 message decoded; BlockStored holds the prompt's 2 full "
        "blocks of 16 tokens",
        "conformance: 9/9 required, 1/1 recommended checks pass",
    ]
    assert status == 0


@pytest.mark.parametrize(
    ("topic", "parent", "as_map", "reason"),
    [
        ("", None, False, "message 1 does not decode: the topic '' is not kv@<pod>@<model>"),
        (
            "kv@pod-a@other",
            None,
            False,
            "the topic 'kv@pod-a@other' names model 'other', not 'm'",
        ),
        (
            "kv@pod-a@m",
            b"\x09" * 8,
            False,
            "1 message in 2 s, no BlockStored chain of the prompt's 35 tokens "
            "(block sizes stored: 16)",
        ),
        (  # what vLLM 0.32's CPU build sends: llm-d's router reads events as arrays only
            "kv@pod-a@m",
            None,
            True,
            "message 1 does not decode: an event is an array led by its tag, got {'type': "
            "'BlockStored', 'block_hashes': [1, 2], 'parent_block_hash': None, 't...",
        ),
    ],
)
def test_kv_events_fail_naming_what_the_stream_gets_wrong(
    fake, capsys, topic, parent, as_map, reason
):
    fake.kv_frames = _stored_frames(topic, lambda n: list(range(1, n + 1)), parent, as_map)
    kv = f"tcp://127.0.0.1:{fake.kv_port}"
    status, lines = conformance(capsys, fake.url, "--kv-events", kv, "--timeout", "2")
    assert lines[-2] == f"FAIL kv-events [required]: {reason}"
    assert status == 1


def test_the_command_never_imports_torch():
    code = (
        "import sys; from kvserve.server.cli import main; "
        "main(['conformance', 'http://127.0.0.1:1', '--timeout', '1']); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.stdout.splitlines()[-1] == "[]"


def test_kvserve_passes_every_check_with_kv_events(checkpoint, tmp_path, capsys):
    kv_port = _free_port()
    events = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{kv_port}",
              "topic": "kv@pod-0@tiny"}  # fmt: skip
    with ServerProcess(
        checkpoint("llama"), "--num-kv-blocks", "64", "--kv-events-config", json.dumps(events),
        log=tmp_path / "server.log",
    ) as server:  # fmt: skip
        status, lines = conformance(
            capsys, server.url, "--api-key", API_KEY, "--kv-events", f"tcp://127.0.0.1:{kv_port}"
        )
    assert lines == [
        "PASS health [required]: GET /health answered 200",
        "PASS models [required]: lists 'tiny' (1 model)",
        "PASS completions [required]: POST /v1/completions answered 200: a text_completion of "
        "4 tokens (length)",
        "PASS chat [required]: POST /v1/chat/completions answered 200: a chat.completion of "
        "4 tokens (length)",
        PASS_HTTP[4],
        *PASS_GAUGES,
        "PASS vllm:cache_config_info [recommended]: gauge, block_size=16, num_gpu_blocks=64",
        "PASS kv-events [required]: 1 message decoded; BlockStored holds the prompt's 2 full "
        "blocks of 16 tokens",
        "conformance: 9/9 required, 1/1 recommended checks pass",
    ]
    assert status == 0
