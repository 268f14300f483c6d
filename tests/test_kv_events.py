"""The KV-event contract: the stream, decoded by the independent decoder and replayed, is the
engine's own prefix cache, block for block, parent links included."""

import json
import threading

import pytest
import zmq
from joined_outputs import JoinedOutputs

from kvserve.conformance.kv_events import (
    END_OF_REPLAY,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheModel,
    decode_frames,
    decode_replay_frames,
    parse_topic,
)
from kvserve.engine.config import EngineConfig
from kvserve.engine.core.block_hash import sha256_chain
from kvserve.engine.kv_events import KVEventsConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.sampling_params import SamplingParams

from server_process import ServerProcess

TOPIC = "kv@pod-a@tiny"
BLOCK_SIZE = 4
RECEIVE_MS = 5000


def engine_with_events(
    checkpoint, endpoint: str, replay_endpoint: str | None = None, **settings
) -> LLMEngine:
    events = KVEventsConfig(
        enable_kv_cache_events=True,
        topic=TOPIC,
        endpoint=endpoint,
        replay_endpoint=replay_endpoint,
    )
    settings = {"block_size": BLOCK_SIZE, "num_kv_blocks": 64, **settings}
    return LLMEngine(
        EngineConfig(model=str(checkpoint("llama")), kv_events_config=events, **settings)
    )


class Subscriber:
    """A SUB socket bound on a free loopback port, as the llm-d router binds its own; the
    engine's publisher connects to ``endpoint``."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.messages: list[list[bytes]] = []

    def receive(self, timeout_ms: int = RECEIVE_MS) -> list[bytes] | None:
        if not self.socket.poll(timeout_ms):
            return None
        frames = self.socket.recv_multipart()
        self.messages.append(frames)
        return frames

    def connect(self, engine: LLMEngine) -> None:
        """Wait out ZMQ's slow joiner: reset the (empty) cache, one AllBlocksCleared batch
        each time, until one arrives; from then on nothing is lost."""
        for _ in range(50):
            assert engine.reset_prefix_cache()
            if self.receive(200) is not None:
                return
        raise AssertionError("the subscriber never received a batch")

    def receive_all(self, engine: LLMEngine) -> None:
        """Receive until the last batch the engine handed to its publisher."""
        last = engine.kv_events.num_batches - 1
        while decode_frames(self.messages[-1])[1] < last:
            assert self.receive() is not None, "the stream stopped before the last batch"

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@pytest.fixture
def subscriber():
    sub = Subscriber()
    yield sub
    sub.close()


def run(engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams) -> dict:
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, params)
    final, seen = {}, JoinedOutputs()
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        for output in seen.add(engine.step()):
            if output.finished:
                final[output.request_id] = output.outputs[0].token_ids
    assert not engine.has_unfinished_requests()
    return final


def engine_cache(engine: LLMEngine) -> set[bytes]:
    """The hashes of the engine's prefix-cache index (the wire carries them as they are)."""
    hashes = {b.block_hash for b in engine.kv.pool.blocks if b.block_hash is not None}
    assert {h for h in hashes if engine.kv.pool.lookup(h) is None} == set()
    return hashes


def medium(engine: LLMEngine) -> str:
    return "GPU" if engine.plan.device.type == "cuda" else "CPU"


def assert_model_is_the_engine_cache(model: CacheModel, engine: LLMEngine) -> None:
    assert model.problems == []
    assert model.blocks == engine_cache(engine)
    for block, parent in model.parents.items():  # the parent link and tokens make the key
        assert block == sha256_chain(parent, list(model.tokens[block]))


def test_stream_replayed_is_the_engine_prefix_cache_after_evictions_and_preemption(
    checkpoint, subscriber
):
    engine = engine_with_events(checkpoint, subscriber.endpoint, num_kv_blocks=24, max_num_seqs=4)
    try:
        subscriber.connect(engine)
        shared = [list(range(10 + 20 * g, 22 + 20 * g)) for g in range(3)]  # 3 blocks each
        prompts = {f"r{i}": [*shared[i % 3], *range(300 + 7 * i, 306 + 7 * i)] for i in range(9)}
        run(engine, prompts, SamplingParams(temperature=0, max_tokens=14, ignore_eos=True))
        subscriber.receive_all(engine)
    finally:
        engine.shutdown()
    assert engine.stats.num_preemptions > 0
    decoded = [decode_frames(m) for m in subscriber.messages]
    first = decoded[0][1]
    assert [seq for _, seq, _ in decoded] == list(range(first, engine.kv_events.num_batches))
    assert {topic for topic, _, _ in decoded} == {TOPIC}
    assert parse_topic(TOPIC) == ("pod-a", "tiny")
    events = [e for _, _, batch in decoded for e in batch.events]
    assert any(isinstance(e, BlockRemoved) for e in events)  # evictions happened
    assert {e.block_size for e in events if isinstance(e, BlockStored)} == {BLOCK_SIZE}
    assert {e.medium for e in events if not isinstance(e, AllBlocksCleared)} == {medium(engine)}
    model = CacheModel()
    for _, _, batch in decoded:
        model.apply(batch)
    assert_model_is_the_engine_cache(model, engine)
    assert engine.kv_events.stats.num_dropped == engine.kv_events.stats.num_errors == 0


def test_block_stored_carries_the_prompt_blocks_exactly(checkpoint, subscriber):
    engine = engine_with_events(checkpoint, subscriber.endpoint)
    try:
        subscriber.connect(engine)
        prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # two full blocks and one token
        run(engine, {"a": prompt}, SamplingParams(temperature=0, max_tokens=1))
        subscriber.receive_all(engine)
    finally:
        engine.shutdown()
    topic, _, batch = decode_frames(subscriber.messages[-1])
    first = sha256_chain(None, prompt[:4])
    second = sha256_chain(first, prompt[4:8])
    assert topic == TOPIC and batch.data_parallel_rank == 0
    stored = BlockStored((first, second), None, tuple(prompt[:8]), 4, None, medium(engine))
    assert batch.events == (stored,)


def test_a_late_subscriber_replays_the_stream_from_the_start(checkpoint, subscriber, tmp_path):
    replay_endpoint = f"ipc://{tmp_path}/replay"
    engine = engine_with_events(checkpoint, subscriber.endpoint, replay_endpoint=replay_endpoint)
    dealer = subscriber.context.socket(zmq.DEALER)
    try:
        run(engine, {"a": list(range(40, 53))}, SamplingParams(temperature=0, max_tokens=3))
        subscriber.connect(engine)  # batches before this one may have reached no subscriber
        run(engine, {"b": list(range(40, 49))}, SamplingParams(temperature=0, max_tokens=9))
        subscriber.receive_all(engine)
        dealer.connect(replay_endpoint)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = {}
        while True:
            assert dealer.poll(RECEIVE_MS), "no replay reply"
            empty, *frames = dealer.recv_multipart()
            assert empty == b""  # the ROUTER's delimiter, which a REQ socket would strip
            seq, batch = decode_replay_frames(frames)
            if seq == END_OF_REPLAY:
                break
            replayed[seq] = (frames[1], batch)
    finally:
        dealer.close(linger=0)
        engine.shutdown()
    assert sorted(replayed) == list(range(engine.kv_events.num_batches))
    live = {decode_frames(m)[1]: m[2] for m in subscriber.messages}
    assert {seq: replayed[seq][0] for seq in live} == live  # the same bytes
    model = CacheModel()
    for seq in sorted(replayed):
        model.apply(replayed[seq][1])
    assert_model_is_the_engine_cache(model, engine)


def test_a_broken_endpoint_does_not_stop_generation(checkpoint, tmp_path):
    prompts = {"a": list(range(60, 75)), "b": list(range(60, 70))}
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    plain = LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64, block_size=4))
    expected = run(plain, prompts, params)
    engine = engine_with_events(checkpoint, f"ipc://{tmp_path}/missing-dir/events")
    try:
        assert run(engine, prompts, params) == expected
    finally:
        engine.shutdown()
    stats = engine.kv_events.stats
    assert engine.kv_events.num_batches > 0
    assert stats.num_errors >= 1 and stats.num_published == 0
    assert stats.num_dropped == engine.kv_events.num_batches


def test_events_are_off_by_default(checkpoint):
    engine = LLMEngine(EngineConfig(model=str(checkpoint("llama")), num_kv_blocks=64))
    run(engine, {"a": list(range(1, 40))}, SamplingParams(temperature=0, max_tokens=2))
    assert engine.kv_events is None and engine.kv.pool.events is None
    assert engine_cache(engine)  # blocks were cached, and no one recorded it
    assert "kvserve-kv-events" not in {t.name for t in threading.enumerate()}


def test_kvserve_serve_publishes_with_the_flag(checkpoint, subscriber, tmp_path):
    config = json.dumps(
        {"enable_kv_cache_events": True, "endpoint": subscriber.endpoint, "topic": TOPIC}
    )
    flags = ("--kv-events-config", config, "--device", "cpu", "--block-size", "4")
    with ServerProcess(checkpoint("llama"), *flags, log=tmp_path / "server.log") as server:
        for attempt in range(5):  # a batch sent before the subscription arrived is lost
            prompt = [100 + attempt, 6, 7, 8, 9]
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0}
            server.post("/v1/completions", body)
            if (frames := subscriber.receive(1000)) is not None:
                break
        else:
            raise AssertionError("no KV-event batch from the server")
    topic, _, batch = decode_frames(frames)
    (stored,) = batch.events  # the server's key is the one this process computes
    key = sha256_chain(None, prompt[:4])
    assert topic == TOPIC and stored == BlockStored((key,), None, tuple(prompt[:4]), 4, None, "CPU")
