"""OpenAI-shaped errors: one exception type, one JSON body shape, one status per kind."""

from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}
# Seconds a client should wait before retrying a 503 (over capacity, draining).
RETRY_AFTER_SECONDS = 1


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for a status: its own name, else the class's (4xx: the
    request is at fault, 5xx: the server)."""
    if status in _TYPES:
        return _TYPES[status]
    return _TYPES[400] if status < 500 else _TYPES[500]


class APIError(Exception):
    """An error the client sees as ``{"error": {message, type, param, code}}`` with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def unavailable(message: str, code: str | None = None) -> APIError:
    """A 503 that tells the client (or the proxy in front) when to retry."""
    return APIError(503, message, code=code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)
