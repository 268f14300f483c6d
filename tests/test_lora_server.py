"""LoRA adapters through a real ``kvserve serve``: ``--lora-modules``, the request's
``model`` naming the adapter, ``/v1/models``, and runtime loading and unloading as vLLM
answers them (with ``KVSERVE_ALLOW_RUNTIME_LORA_UPDATING``)."""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from transformers import AutoTokenizer

from lora_adapters import build_adapter, merged_checkpoint
from reference import hf_greedy
from server_process import ServerProcess

PROMPT = list(range(40, 70))
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def built(checkpoint, tmp_path_factory):
    base = checkpoint("llama")
    root = tmp_path_factory.mktemp("lora-server")
    adapters = {
        name: build_adapter(base, root / name, rank, seed=seed)
        for name, rank, seed in [("a", 8, 1), ("b", 16, 2), ("c", 8, 3), ("wide", 32, 4)]
    }
    merged = {n: merged_checkpoint(base, p, root / f"{n}-merged") for n, p in adapters.items()}
    return base, adapters, merged


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    base, adapters, _ = built
    log = tmp_path_factory.mktemp("server") / "server.log"
    b = json.dumps({"name": "b", "path": str(adapters["b"]), "base_model_name": "tiny-base"})
    args = ("--num-kv-blocks", "256", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16")
    os.environ["KVSERVE_ALLOW_RUNTIME_LORA_UPDATING"] = "true"
    try:
        with ServerProcess(base, *args, "--lora-modules", f"a={adapters['a']}", b, log=log) as s:
            yield s
    finally:
        del os.environ["KVSERVE_ALLOW_RUNTIME_LORA_UPDATING"]


def send(server, path: str, body: dict) -> tuple[int, bytes]:
    status, _, data = server.send(path, json.dumps(body).encode(), {"Content-Type": "x/json"})
    return status, data


def completion(server, model: str) -> tuple[int, dict]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    status, data = send(server, "/v1/completions", body)
    return status, json.loads(data)


def expected_text(built, name: str | None) -> str:
    base, _, merged = built
    path = str(base if name is None else merged[name])
    return AutoTokenizer.from_pretrained(base).decode(hf_greedy(path, PROMPT, MAX_TOKENS))


def models(server) -> dict[str, dict]:
    status, _, data = server.send("/v1/models", None, method="GET")
    assert status == 200
    return {card["id"]: card for card in json.loads(data)["data"]}


def test_models_lists_the_adapters_with_their_parent(server, built):
    cards = models(server)
    assert set(cards) == {"tiny", "a", "b"}
    assert cards["a"]["parent"] == "tiny" and cards["a"]["root"] == str(built[1]["a"])
    assert cards["b"]["parent"] == "tiny-base"


def test_the_model_field_picks_the_adapter(server, built):
    for model, adapter in [("tiny", None), ("a", "a"), ("b", "b")]:
        status, body = completion(server, model)
        assert status == 200 and body["model"] == model
        assert body["choices"][0]["text"] == expected_text(built, adapter)
    assert expected_text(built, "a") != expected_text(built, None)


def test_load_and_unload_at_runtime_as_vllm_answers(server, built):
    _, adapters, _ = built
    load = {"lora_name": "c", "lora_path": str(adapters["c"])}
    assert send(server, "/v1/load_lora_adapter", load) == (
        200,
        b"Success: LoRA adapter 'c' added successfully.",
    )
    status, body = completion(server, "c")
    assert status == 200 and body["choices"][0]["text"] == expected_text(built, "c")
    assert models(server)["c"]["parent"] == "tiny"
    status, data = send(server, "/v1/load_lora_adapter", load)
    assert status == 400
    assert json.loads(data)["error"]["message"] == "The lora adapter 'c' has already been loaded."
    assert send(server, "/v1/unload_lora_adapter", {"lora_name": "c"}) == (
        200,
        b"Success: LoRA adapter 'c' removed successfully.",
    )
    status, body = completion(server, "c")
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, data = send(server, "/v1/unload_lora_adapter", {"lora_name": "c"})
    assert status == 404
    assert json.loads(data)["error"] == {
        "message": "The lora adapter 'c' cannot be found.",
        "type": "not_found_error",
        "param": "lora_name",
        "code": None,
    }


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"lora_name": "x"}, "Both 'lora_name' and 'lora_path' must be provided."),
        ({"lora_name": "x", "lora_path": "/nowhere"}, "LoRA adapter 'x': no such directory"),
        ("wide", "LoRA adapter 'wide': adapter_config.json r: rank 32 is above --max-lora-rank"),
    ],
)
def test_an_adapter_that_cannot_load_is_a_400_naming_it(server, built, body, words):
    if body == "wide":
        body = {"lora_name": "wide", "lora_path": str(built[1]["wide"])}
    before = models(server)
    status, data = send(server, "/v1/load_lora_adapter", body)
    error = json.loads(data)["error"]
    assert status == 400 and error["type"] == "invalid_request_error" and words in error["message"]
    assert models(server) == before


def test_loads_and_unloads_leave_requests_in_flight_alone(server, built):
    _, adapters, _ = built
    with ThreadPoolExecutor(6) as pool:
        running = [pool.submit(completion, server, m) for m in ["a", "b", "tiny"] * 2]
        for _ in range(3):
            load = {"lora_name": "c", "lora_path": str(adapters["c"])}
            assert send(server, "/v1/load_lora_adapter", load)[0] == 200
            assert send(server, "/v1/unload_lora_adapter", {"lora_name": "c"})[0] == 200
        results = [f.result() for f in running]
    for model, (status, body) in zip(["a", "b", "tiny"] * 2, results, strict=True):
        adapter = None if model == "tiny" else model
        assert status == 200 and body["choices"][0]["text"] == expected_text(built, adapter)


def test_without_runtime_updating_the_routes_do_not_exist(checkpoint, tmp_path, monkeypatch):
    monkeypatch.delenv("KVSERVE_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    with ServerProcess(checkpoint("llama"), "--enable-lora", log=tmp_path / "log") as s:
        status, _ = send(s, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/x"})
        assert status == 404
