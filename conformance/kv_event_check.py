"""The KV-event stream, as the llm-d router subscribes to it: after a request whose prompt
fills whole blocks, the stream must carry, decodable, on a ``kv@<pod>@<model>`` topic, a
``BlockStored`` chain holding exactly that prompt's full blocks (the first one's parent nil,
each next one's parent the block before it).

Decoding is ``kvserve.conformance.kv_events``, written from the published format and sharing
no code with kvserve's publisher. An ENDPOINT whose host is ``*`` is bound (the server
connects to it, as pods connect to the router); any other is connected to (the server binds
it, vLLM's default ``tcp://*:5557``).
"""

import random
import time
from dataclasses import dataclass

import zmq

from kvserve.conformance.api_checks import describe
from kvserve.conformance.client import Server
from kvserve.conformance.kv_events import (
    BlockStored,
    CacheModel,
    FormatError,
    decode_frames,
    parse_topic,
)
from kvserve.conformance.report import plural

# A SUB socket sees only messages published after its subscription reached the publisher.
SUBSCRIBE_SETTLE_SECONDS = 0.5
# Prompt length when /metrics announces no block size: two full blocks of up to 64 tokens.
UNKNOWN_BLOCK_SIZE = 64
# Token ids drawn for the prompt: above any special token, below any real vocabulary's size.
TOKEN_RANGE = (10, 256)


@dataclass
class Stream:
    """What the subscriber has seen so far."""

    cache: CacheModel
    block_sizes: set[int]
    num_messages: int = 0
    last_seq: int = -1


def fresh_prompt(block_size: int | None) -> list[int]:
    """Random token ids (no prefix cache holds them): two full blocks and three tokens."""
    rng = random.Random(time.time_ns())
    length = 2 * (block_size or UNKNOWN_BLOCK_SIZE) + 3
    return [rng.randrange(*TOKEN_RANGE) for _ in range(length)]


def find_chain(cache: CacheModel, prompt: list[int], block_size: int) -> int:
    """How many of ``prompt``'s full blocks the cache holds as one chain from a nil parent."""
    parent = None
    for index in range(len(prompt) // block_size):
        block = tuple(prompt[index * block_size : (index + 1) * block_size])
        match = [h for h, tokens in cache.tokens.items() if tokens == block]
        match = [h for h in match if cache.parents[h] == parent]
        if not match:
            return index
        parent = match[0]
    return len(prompt) // block_size


def _open(context: zmq.Context, endpoint: str) -> zmq.Socket:
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    if "://*" in endpoint:
        socket.bind(endpoint)
    else:
        socket.connect(endpoint)
    return socket


def _receive(stream: Stream, frames: list[bytes], model: str) -> str | None:
    """Replays one message into ``stream``; returns what is wrong with it, if anything."""
    try:
        topic, seq, batch = decode_frames(frames)
        _, topic_model = parse_topic(topic)
    except FormatError as exc:
        return f"message {stream.num_messages + 1} does not decode: {exc}"
    if topic_model != model:
        return f"the topic {topic!r} names model {topic_model!r}, not {model!r}"
    if seq <= stream.last_seq:
        return f"sequence number {seq} follows {stream.last_seq}"
    stream.num_messages += 1
    stream.last_seq = seq
    stream.cache.apply(batch)
    stream.block_sizes |= {e.block_size for e in batch.events if isinstance(e, BlockStored)}
    return None


def check_kv_events(
    server: Server, model: str, endpoint: str, block_size: int | None
) -> tuple[bool, str]:
    """``block_size``: what ``vllm:cache_config_info`` announced, if anything."""
    context = zmq.Context()
    try:
        socket = _open(context, endpoint)
    except zmq.ZMQError as exc:
        context.term()
        return False, f"cannot subscribe at {endpoint}: {exc}"
    try:
        time.sleep(SUBSCRIBE_SETTLE_SECONDS)
        prompt = fresh_prompt(block_size)
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        reply = server.post("/v1/completions", body)
        if reply.status != 200:
            return False, describe("POST /v1/completions", reply)
        stream = Stream(CacheModel(), set())
        deadline = time.monotonic() + server.timeout
        while (wait := deadline - time.monotonic()) > 0:
            if not socket.poll(int(wait * 1000) + 1):
                break
            problem = _receive(stream, socket.recv_multipart(), model)
            if problem:
                return False, problem
            for size in {block_size} if block_size else stream.block_sizes:
                full = len(prompt) // size
                if full and find_chain(stream.cache, prompt, size) == full:
                    seen = plural(stream.num_messages, "message")
                    return True, (
                        f"{seen} decoded; BlockStored holds the prompt's {full} full blocks "
                        f"of {size} tokens"
                    )
        found = ", ".join(map(str, sorted(stream.block_sizes))) or "none"
        seen = plural(stream.num_messages, "message")
        return False, (
            f"{seen} in {server.timeout:g} s, no BlockStored chain of the prompt's "
            f"{len(prompt)} tokens (block sizes stored: {found})"
        )
    finally:
        socket.close()
        context.term()
