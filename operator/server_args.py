"""The server's own verdict on a rendered ``kvserve serve`` container, without starting it.

A pod whose server refuses its flags exits at once and crash-loops. The operator runs the
container's arguments and environment through the server's argument parser and engine settings
(``kvserve.server.cli``: no model is loaded, no torch imported) and reports a refusal as
``Degraded`` before it applies anything. Environment entries whose value comes from a Secret or
ConfigMap are unknown here; the parser sees only literal values.
"""

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from kvserve.server.cli import engine_config, serve_parser


class _CheckingParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def server_refusal(args: Sequence[str], env: Sequence[dict[str, Any]]) -> str | None:
    """Why ``kvserve ARGS`` in a container with ``env`` would refuse to start, or None."""
    if list(args[:1]) != ["serve"]:
        return f"the server's first argument must be 'serve', not {list(args[:1])}"
    environ = {e["name"]: e["value"] for e in env if isinstance(e.get("value"), str)}
    try:
        # add_help=False: ``--help`` would print and exit 0, a pod that never serves.
        parser = serve_parser(_CheckingParser(prog="kvserve serve", add_help=False), environ)
        engine_config(parser.parse_args(list(args[1:])))
    except SystemExit as e:  # an environment variable the parser cannot read
        return str(e.code)
    except ValueError as e:
        return str(e)
    return None
