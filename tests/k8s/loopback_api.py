"""A loopback HTTP server that answers the operator's GETs with recorded API server answers,
for the kube client code that needs no cluster (a Secret read, API discovery)."""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client


@contextmanager
def answering(answers: dict[str, dict[str, Any]]) -> Iterator[client.ApiClient]:
    """An ``ApiClient`` whose GET of a path in ``answers`` gets that JSON, of any other path a
    404 Status."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            body = answers.get(path, {"kind": "Status", "reason": "NotFound", "code": 404})
            payload = json.dumps(body).encode()
            self.send_response(200 if path in answers else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        with client.ApiClient(config) as api:
            yield api
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
