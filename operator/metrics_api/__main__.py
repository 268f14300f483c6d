"""``python -m kvserve.operator.metrics_api``: serve the custom metrics API over TLS.

The serving certificate is ``tls.crt``/``tls.key`` in ``--cert-dir`` (the chart's Secret, whose
CA is the APIService's caBundle). The requestheader CA and header names are read once, at
start, from ``kube-system/extension-apiserver-authentication``; the apiserver's CA rotation
therefore needs a restart of this server.
"""

import argparse
import asyncio
import logging
import os
from typing import Any

from aiohttp import web
from kubernetes import client, config

from kvserve.operator.metrics_api.app import make_app
from kvserve.operator.metrics_api.auth import Authorizer, server_ssl_context
from kvserve.operator.metrics_api.cluster import list_pods, read_requestheader_config, review_access


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kvserve.operator.metrics_api")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--cert-dir", default="/etc/kvserve/metrics-api-tls")
    parser.add_argument("--scrape-timeout", type=float, default=2.0, help="seconds per pod")
    parser.add_argument("--max-age", type=float, default=5.0, help="seconds a sample is reused")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config.load_config()
    api = client.ApiClient()
    requestheader = read_requestheader_config(api)
    tls = server_ssl_context(
        os.path.join(args.cert_dir, "tls.crt"),
        os.path.join(args.cert_dir, "tls.key"),
        requestheader,
    )

    async def pods(namespace: str, selector: str) -> list[dict]:
        return await asyncio.to_thread(list_pods, api, namespace, selector)

    async def review(body: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(review_access, api, body)

    authorizer = Authorizer(review)
    app = make_app(requestheader, authorizer, pods, args.scrape_timeout, args.max_age)
    web.run_app(app, port=args.port, ssl_context=tls, access_log=None, print=None)


if __name__ == "__main__":
    main()
