"""Property-based attack on a real server: thousands of generated hostile requests.

Bodies are valid requests with fields replaced by hostile JSON (huge and negative
numbers, NaN, lone surrogates, wrong types, deep nesting, unknown names), whole
non-object bodies, and raw bytes under odd charsets and content codings. Whatever comes
in, the answer is never a 5xx, every error is ``{"error": {message, type, param, code}}``,
every stream ends with ``[DONE]``, and afterwards the engine is idle and holds no block.
Derandomized, so CI runs the same examples every time.
"""

import http.client
import json
import time
from collections import Counter
from importlib.metadata import version

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from kvserve.server.openapi import REQUESTS, openapi_document

from rank_counts import TENSOR_PARALLEL, TENSOR_PARALLEL_IDS
from server_process import API_KEY, ServerProcess

BASES = {
    "/v1/completions": {"prompt": "def f(x):", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [5, 6]},
}
FIELDS = {path: sorted(model.model_fields) for path, model in REQUESTS.items()}
EDGE_INTS = [0, -1, 1, 511, 512, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]
SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

texts = st.text(max_size=12) | st.sampled_from(["\ud800", "a\udfffb", "٣", "--3", "", "é" * 3])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from(EDGE_INTS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | texts
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
DEEP = "\x00deep\x00"  # stands for arrays nested deeper than json.dumps goes
depths = st.integers(1, 40) | st.sampled_from([999, 1000, 5000, 100_000])


@st.composite
def requests(draw) -> tuple[str, bytes]:
    """An endpoint and a JSON body: its valid base with 1-3 fields replaced or removed."""
    path = draw(st.sampled_from(sorted(BASES)))
    body = json.loads(json.dumps(BASES[path]))
    depth = draw(depths)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(FIELDS[path]) | texts)
        action = draw(st.sampled_from(["set", "set", "set", "nest", "delete", "message"]))
        if action == "delete":
            body.pop(name, None)
        elif action == "nest":
            body[name] = DEEP
        elif action == "message" and path == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": "hi"}]
            key = draw(st.sampled_from(["role", "content", "name"]) | texts)
            body["messages"][0][key] = draw(values)
        else:
            body[name] = draw(values)
    whole = draw(st.integers(0, 19)) == 0  # now and then a body that is not an object
    text = json.dumps(draw(values) if whole else body, allow_nan=True)
    return path, text.replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode()


class Client:
    """One keep-alive connection, reopened when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def send(self, path: str, data: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        headers = {"Authorization": f"Bearer {API_KEY}", **headers}
        for attempt in range(2):
            try:
                self.connection.request("POST", path, body=data, headers=headers)
                response = self.connection.getresponse()
                return response.status, response.getheader("Content-Type", ""), response.read()
            except (http.client.RemoteDisconnected, ConnectionError):
                self.connection.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")


def check_answer(status: int, content_type: str, body: bytes) -> int:
    """The status, once the answer is checked."""
    assert status < 500, body
    if content_type.startswith("text/event-stream"):
        events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]", body
        for event in events[:-1]:
            payload = json.loads(event)
            assert "choices" in payload or set(payload["error"]) == ERROR_KEYS
        return status
    answer = json.loads(body)
    if status >= 400:
        assert list(answer) == ["error"], answer
        error = answer["error"]
        assert set(error) == ERROR_KEYS, answer
        assert isinstance(error["message"], str), answer
        assert error["message"], answer
        assert isinstance(error["type"], str), answer
        assert " " not in error["type"], answer
        assert error["param"] is None or isinstance(error["param"], str)
        assert error["code"] is None or isinstance(error["code"], str)
    return status


ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module", params=TENSOR_PARALLEL, ids=TENSOR_PARALLEL_IDS)
def server(checkpoint, tmp_path_factory, request):
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = ("--num-kv-blocks", "64", "--max-model-len", "64", "--max-waiting-requests", "16")
    tp = ("--tensor-parallel-size", str(request.param))
    with ServerProcess(checkpoint("llama"), *args, *tp, log=log) as s:
        yield s


def assert_idle(server: ServerProcess) -> None:
    """Nothing running, nothing waiting, no KV block held, and the probes say so."""
    deadline = time.monotonic() + 10
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
    while [server.metric(n) for n in names] != [0, 0, 0] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [server.metric(n) for n in names] == [0, 0, 0]
    assert (server.status("/ready"), server.status("/health")) == (200, 200)


def test_generated_json_bodies(server):
    client = Client(server.port)
    statuses: Counter[int] = Counter()

    @settings(max_examples=2500, **SETTINGS)
    @given(requests())
    def attack(request: tuple[str, bytes]) -> None:
        path, data = request
        statuses[check_answer(*client.send(path, data, {"Content-Type": "application/json"}))] += 1

    attack()
    assert statuses[200] >= 100, statuses  # the attack reaches the engine too
    assert_idle(server)


CODINGS = ["identity", "gzip", "deflate", "br", "zstd", "compress", "gzip, br"]
CHARSETS = ["utf-8", "latin-1", "utf-16", "utf-32", "ascii", "klingon", ""]


@st.composite
def raw_requests(draw) -> tuple[str, bytes, dict[str, str]]:
    """Bytes that are not quite JSON, under odd Content-Type and Content-Encoding headers."""
    path = draw(st.sampled_from(sorted(BASES)))
    valid = json.dumps(BASES[path]).encode()
    data = draw(
        st.binary(max_size=64)
        | st.integers(0, len(valid)).map(lambda cut: valid[:cut])
        | st.just(valid)
        | st.just(valid.decode().encode("utf-16"))
    )
    headers = {"Content-Type": "application/json; charset=" + draw(st.sampled_from(CHARSETS))}
    coding = draw(st.none() | st.sampled_from(CODINGS))
    if coding is not None:
        headers["Content-Encoding"] = coding
    return path, data, headers


def test_generated_raw_bodies(server):
    client = Client(server.port)

    statuses: Counter[int] = Counter()

    @settings(max_examples=600, **SETTINGS)
    @given(raw_requests())
    def attack(request: tuple[str, bytes, dict[str, str]]) -> None:
        statuses[check_answer(*client.send(*request))] += 1

    attack()
    assert statuses[200] >= 10, statuses
    assert statuses[415] >= 100, statuses
    assert_idle(server)


SCHEMA = schemathesis.openapi.from_dict(openapi_document(version("kvserve")))
SCHEMA.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


def test_the_served_openapi_document_is_the_one_attacked(server):
    assert json.loads(server.get("/openapi.json")) == SCHEMA.raw_schema


@SCHEMA.parametrize()
@settings(max_examples=150, **SETTINGS)
def test_schemathesis_against_the_openapi_document(case, server):
    """Schemathesis's own valid and invalid bodies for every operation: no 5xx, and every
    error matches the document's ``Error`` schema."""
    response = case.call(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"})
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])


def test_the_engine_is_idle_after_schemathesis(server):
    assert_idle(server)
