"""The independent decoder: hand-built msgpack in the published layout, in and out."""

import msgpack
import pytest

from kvserve.conformance.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheModel,
    EventBatch,
    FormatError,
    decode_batch,
    decode_frames,
    parse_topic,
)

SEQ = (7).to_bytes(8, "big")


def payload(*events, rank=None) -> bytes:
    return msgpack.packb([1.25, list(events), *([] if rank is None else [rank])])


def test_older_and_newer_vllm_layouts_decode_alike():
    older = ["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None]  # int hashes, no medium
    newer = ["BlockStored", [b"\x01" * 32], 12, [5, 6], 2, None, "GPU", None, None, 0]
    topic, seq, batch = decode_frames(
        [b"kv@p@m", SEQ, payload(older, newer, ["BlockRemoved", [11], "GPU"], rank=0)]
    )
    assert (topic, seq) == ("kv@p@m", 7)
    assert batch == EventBatch(
        1.25,
        (
            BlockStored((11, 12), None, (1, 2, 3, 4), 2),
            BlockStored((b"\x01" * 32,), 12, (5, 6), 2, None, "GPU"),
            BlockRemoved((11,), "GPU"),
        ),
        0,
    )
    assert decode_batch(payload(["AllBlocksCleared"])).events == (AllBlocksCleared(),)


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([b"kv@p@m", SEQ], "a message has 3 frames"),
        ([b"kv@p@m", b"\x00" * 4, payload()], "a sequence number is 8 bytes, got 4"),
        ([b"\xff", SEQ, payload()], "the topic is not utf-8"),
        ([b"t", SEQ, b"\xc1"], "the payload is not msgpack"),
        ([b"t", SEQ, msgpack.packb({"ts": 1.0, "events": []})], "a batch is \\[ts, events"),
        ([b"t", SEQ, payload({"type": "BlockRemoved"})], "an event is an array led by its tag"),
        ([b"t", SEQ, payload(["BlockEvicted", [1]])], "unknown event tag 'BlockEvicted'"),
        ([b"t", SEQ, payload(["BlockStored", [1], None, [1]])], "at least 4 fields, got 3"),
        ([b"t", SEQ, payload(["BlockStored", [], None, [], 2])], "block_hashes is a non-empty"),
        ([b"t", SEQ, payload(["BlockStored", [1], None, [1], 0])], "block_size is a positive"),
        ([b"t", SEQ, payload(["BlockRemoved", [1], 5])], "BlockRemoved.medium: 5"),
    ],
)
def test_what_breaks_the_format_is_named(frames, message):
    with pytest.raises(FormatError, match=message):
        decode_frames(frames)


def test_the_topic_names_pod_and_model():
    assert parse_topic("kv@vllm-0@meta-llama/Llama-3.1-8B") == ("vllm-0", "meta-llama/Llama-3.1-8B")
    for bad in ("", "kv@pod", "kv@@m", "ev@p@m", "kv@p@m@x"):
        with pytest.raises(FormatError, match="is not kv@<pod>@<model>"):
            parse_topic(bad)


def test_the_model_replays_events_and_names_what_is_inconsistent():
    model = CacheModel()
    model.apply(
        EventBatch(
            0.0,
            (
                BlockStored((1, 2), None, (10, 11, 12, 13), 2),
                BlockStored((3,), 1, (14, 15), 2),
                BlockRemoved((2,)),
            ),
        )
    )
    assert model.parents == {1: None, 3: 1} and model.tokens == {1: (10, 11), 3: (14, 15)}
    assert model.problems == []
    model.apply(
        EventBatch(
            0.0,
            (
                BlockStored((3,), 1, (14, 15), 2),
                BlockStored((4,), 3, (16,), 2),
                BlockRemoved((9,)),
            ),
        )
    )
    assert model.problems == [
        "stored 3, which is already cached",
        "1 blocks of 2 tokens stored with 1 tokens",
        "removed 9, which is not cached",
    ]
    model.apply(EventBatch(0.0, (AllBlocksCleared(),)))
    assert model.blocks == set() and model.tokens == {}
