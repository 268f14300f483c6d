"""``kvserve serve``: flags named as vLLM names them, each also read from ``KVSERVE_<FLAG>``.

A flag on the command line beats its environment variable, which beats the default.
"""

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvserve.conformance.command import conformance_parser
from kvserve.conformance.command import run as run_conformance
from kvserve.engine.config import EngineConfig
from kvserve.engine.kv_events import KVEventsConfig
from kvserve.server.tool_parsers import TOOL_PARSERS

DEFAULT_MODEL = Path(__file__).parent / "default_model"
ENV_PREFIX = "KVSERVE_"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _env_name(dest: str) -> str:
    return ENV_PREFIX + dest.upper()


def _env_bool(name: str, text: str) -> bool:
    if text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    raise SystemExit(f"kvserve: {name} must be true or false, not {text!r}")


def _kv_events_config(text: str) -> KVEventsConfig:
    try:
        return KVEventsConfig.from_json(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def serve_parser(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ
) -> argparse.ArgumentParser:
    """The ``serve`` flags on ``parser``, defaults read from ``environ`` (the operator passes a
    pod's environment to check a spec without starting a server)."""
    add = parser.add_argument
    add("--model", default=None, help="checkpoint directory (default: the embedded demo model)")
    add("--served-model-name", default=None, help="name clients use (default: --model)")
    add("--host", default="0.0.0.0")
    add("--port", type=int, default=8000)
    add("--api-key", default=None, help="require 'Authorization: Bearer KEY' on the API")
    add("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    add("--device", choices=["auto", "cpu", "cuda"], default="auto")
    add("--attention-backend", choices=["auto", "torch", "cpu", "triton"], default="auto")
    add("--max-model-len", type=int, default=None)
    add("--max-num-seqs", type=int, default=64)
    add("--max-num-batched-tokens", type=int, default=2048)
    add("--block-size", type=int, default=16)
    add("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    add("--kv-cache-memory-gb", type=float, default=None, help="KV-cache budget in GiB")
    add("--num-kv-blocks", type=int, default=None, help="exact number of KV blocks")
    add("--gpu-memory-utilization", type=float, default=0.9)
    add(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="no CUDA graphs",
    )
    add("--tensor-parallel-size", type=int, default=1)
    add("--seed", type=int, default=0)
    add(
        "--kv-events-config",
        type=_kv_events_config,
        default=None,
        metavar="JSON",
        help="publish KV-cache events over ZMQ, vLLM's JSON keys, e.g. "
        '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv@POD@MODEL"}\'',
    )
    add("--max-waiting-requests", type=int, default=None, help="queue limit; beyond it, 503")
    add("--shutdown-timeout", type=float, default=30.0, help="drain limit after SIGTERM (s)")
    add(
        "--timeout-keep-alive",
        type=float,
        default=5.0,
        help="seconds a connection may sit idle or take to send its request headers",
    )
    add(
        "--request-body-timeout",
        type=float,
        default=30.0,
        help="seconds a request body may take to arrive; beyond it, 408",
    )
    add(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="parse tool calls out of the output for tool_choice 'auto' (needs --tool-call-parser)",
    )
    add("--tool-call-parser", choices=sorted(TOOL_PARSERS), default=None, help="tool-call format")
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        env = _env_name(action.dest)
        action.help = f"{action.help + '; ' if action.help else ''}env {env}"
        text = environ.get(env)
        if text is None:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            action.default = _env_bool(env, text)
        elif action.choices is not None and text not in action.choices:
            raise SystemExit(f"kvserve: {env} must be one of {', '.join(action.choices)}")
        else:
            action.default = text  # argparse converts a string default with the flag's type
    return parser


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's settings from parsed ``serve`` flags; ``ValueError`` names a bad one."""
    return EngineConfig(
        model=str(args.model or DEFAULT_MODEL),
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        enable_prefix_caching=args.enable_prefix_caching,
        attention_backend=args.attention_backend,
        tensor_parallel_size=args.tensor_parallel_size,
        seed=args.seed,
        kv_events_config=args.kv_events_config,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvserve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser(commands.add_parser("serve", help="serve a model over the OpenAI API"))
    conformance_parser(
        commands.add_parser(
            "conformance", help="check a model server against the gateway's protocol"
        )
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        if args.enable_auto_tool_choice and args.tool_call_parser is None:
            parser.error("--enable-auto-tool-choice requires --tool-call-parser")
        from kvserve.server.serve import serve

        return serve(args)
    if args.command == "conformance":
        return run_conformance(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
