"""Plain HTTP to the server under test, every request bounded by one timeout."""

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


class Unreachable(Exception):
    """No HTTP answer at all: refused, reset, timed out, or not an HTTP server."""


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes

    def json(self) -> Any:
        """The body as JSON; ``ValueError`` when it is not JSON."""
        return json.loads(self.body)


@dataclass(frozen=True)
class Server:
    url: str
    api_key: str | None
    timeout: float

    def get(self, path: str) -> Reply:
        return self._send(urllib.request.Request(self.url + path, headers=self._headers()))

    def post(self, path: str, body: dict[str, Any]) -> Reply:
        headers = self._headers() | {"Content-Type": "application/json"}
        data = json.dumps(body).encode()
        return self._send(urllib.request.Request(self.url + path, data=data, headers=headers))

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _send(self, request: urllib.request.Request) -> Reply:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return Reply(response.status, response.headers.get_content_type(), response.read())
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.headers.get_content_type(), exc.read())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"{request.get_method()} {request.full_url}: {reason}") from exc
