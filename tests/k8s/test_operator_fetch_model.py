"""The fetch-model init container's program: the one line it leaves when a download fails.

The downloads go to a hub played on loopback; tests/e2e checks a name that does not resolve,
inside a pod on the real node.
"""

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from kvserve.operator.fetch_model import MAX_CHARS, failure_line, innermost, main


class _Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every request 404 with the error code the hub gives an unknown revision."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RevisionNotFound")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    yield endpoint
    server.shutdown()
    thread.join(timeout=10)


def test_a_missing_revision_leaves_one_line_naming_it(
    hub: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination-log"
    assert main(["org/name", "v9", str(tmp_path / "model")], termination_log=log) == 1
    assert log.read_text() == (
        f"cannot download org/name@v9 from {hub}: HTTPStatusError: Client error '404 Not Found' "
        f"for url '{hub}/api/models/org/name/revision/v9' (raised as RevisionNotFoundError)\n"
    )
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def _raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    try:
        raise error from cause
    except BaseException as e:
        return e


def test_the_cause_is_the_innermost_error_of_the_chain() -> None:
    full = OSError(28, "No space left on device")
    wrapped = _raised(RuntimeError("download failed\nsee above"), _raised(full))
    assert innermost(wrapped) is full
    assert failure_line("org/name", "", "http://hub", wrapped) == (
        "cannot download org/name from http://hub: [Errno 28] No space left on device "
        "(raised as RuntimeError)"
    )


def test_a_suppressed_context_is_not_the_cause() -> None:
    try:
        try:
            raise KeyError("etag")
        except KeyError:
            raise ValueError("bad answer") from None
    except ValueError as e:
        error = e
    assert innermost(error) is error
    assert failure_line("org/name", "main", "http://hub", error) == (
        "cannot download org/name@main from http://hub: ValueError: bad answer"
    )


def test_an_errno_names_itself_whichever_class_carries_it() -> None:
    class ConnectError(Exception):
        pass

    resolving = "[Errno -3] Temporary failure in name resolution"
    for cause in (
        socket.gaierror(-3, "Temporary failure in name resolution"),
        ConnectError(resolving),
    ):
        error = _raised(LookupError(), cause)
        assert failure_line("org/name", "", "http://hub.invalid", error) == (
            f"cannot download org/name from http://hub.invalid: {resolving} (raised as LookupError)"
        )


def test_a_cause_without_a_message_is_its_type() -> None:
    assert failure_line("org/name", "", "http://hub", TimeoutError()) == (
        "cannot download org/name from http://hub: TimeoutError"
    )


def test_a_long_cause_is_cut() -> None:
    line = failure_line("org/name", "", "http://hub", ValueError("x" * 5000))
    assert len(line) == MAX_CHARS and line.endswith("xxx")


def test_a_chain_that_loops_ends() -> None:
    outer, inner = ValueError("outer"), KeyError("inner")
    outer.__cause__, inner.__cause__ = inner, outer
    assert innermost(outer) is inner
