"""Server-sent events: each event is one ``data:`` line and a blank line."""

from kvserve.server.sse import encode_event


def test_sse_frames():
    assert encode_event({"a": "é"}) == 'data: {"a": "é"}\n\n'.encode()
    assert encode_event("[DONE]") == b"data: [DONE]\n\n"
