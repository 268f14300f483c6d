"""``kvserve serve``: flags named as vLLM names them, each also read from ``KVSERVE_<FLAG>``.

A flag on the command line beats its environment variable, which beats the default.
"""

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvserve.conformance.command import conformance_parser
from kvserve.conformance.command import run as run_conformance
from kvserve.engine.config import EngineConfig
from kvserve.engine.settings import Declared, declared
from kvserve.server import smollm2
from kvserve.server.server_settings import SERVE_SETTINGS

DEFAULT_MODEL = Path(__file__).parent / "default_model"
"""The embedded demo model: what ``serve`` answers with until SmolLM2 is fetched."""
DEMO_MODEL_NAME = "kvserve-demo"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _env_bool(name: str, text: str) -> bool:
    if text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    raise SystemExit(f"kvserve: {name} must be true or false, not {text!r}")


def env_words(name: str, text: str) -> list[str]:
    """The values of a list setting's environment variable: a JSON array (each string as it
    is, each object as its JSON text), or words apart by whitespace (newlines included) where a
    word that opens a JSON object runs to the object's end, spaces inside it kept."""
    decoder = json.JSONDecoder()
    if text.lstrip().startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"kvserve: {name} is not a JSON array: {exc}") from exc
        if not all(isinstance(v, str | dict) for v in values):
            raise SystemExit(f"kvserve: {name}: a JSON array of strings and objects, got {text!r}")
        return [v if isinstance(v, str) else json.dumps(v) for v in values]
    words: list[str] = []
    at = 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return words
        if text[at] == "{":
            try:
                _, end = decoder.raw_decode(text, at)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"kvserve: {name}: invalid JSON object: {exc}") from exc
            if end < len(text) and not text[end].isspace():
                raise SystemExit(f"kvserve: {name}: {text[at:]!r}: no space after a JSON object")
        else:
            end = at
            while end < len(text) and not text[end].isspace():
                end += 1
        words.append(text[at:end])
        at = end


def _add_flag(parser: argparse.ArgumentParser, d: Declared) -> argparse.Action:
    spelling = d.setting
    options: dict[str, Any] = {"dest": d.name, "default": d.default, "help": spelling.help}
    if d.kind is bool:
        options["action"] = argparse.BooleanOptionalAction
    else:
        options["type"] = d.kind if spelling.parse is None else _argument_type(spelling.parse)
        options["choices"] = spelling.choices
        options["metavar"] = spelling.metavar
        if spelling.nargs is not None:
            options["nargs"] = spelling.nargs
    return parser.add_argument(d.flag, **options)


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, its ``ValueError`` or ``TypeError`` shown to the user as it is."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return convert


def serve_parser(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ
) -> argparse.ArgumentParser:
    """The ``serve`` flags on ``parser``, defaults read from ``environ`` (the operator passes a
    pod's environment to check a spec without starting a server)."""
    for d in SERVE_SETTINGS:
        action = _add_flag(parser, d)
        action.help = f"{action.help + '; ' if action.help else ''}env {d.env}"
        text = environ.get(d.env)
        if text is None:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            action.default = _env_bool(d.env, text)
        elif action.choices is not None and text not in action.choices:
            raise SystemExit(f"kvserve: {d.env} must be one of {', '.join(action.choices)}")
        elif action.nargs is not None:
            assert action.type is not None and not isinstance(action.type, str)
            try:
                action.default = [action.type(word) for word in env_words(d.env, text)]
            except argparse.ArgumentTypeError as exc:
                raise SystemExit(f"kvserve: {d.env}: {exc}") from exc
        else:
            action.default = text  # argparse converts a string default with the flag's type
    return parser


def default_model() -> tuple[Path, str]:
    """The model ``serve`` answers with when no ``--model`` is given, and its served name:
    SmolLM2-135M-Instruct once fetched into the cache (``server/smollm2.py``), else the
    embedded demo model."""
    real = smollm2.cached()
    if real is not None:
        return real, smollm2.SERVED_NAME
    return DEFAULT_MODEL, DEMO_MODEL_NAME


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine's settings from parsed ``serve`` flags; ``ValueError`` names a bad one."""
    values = {d.name: getattr(args, d.name) for d in declared(EngineConfig)}
    return EngineConfig(**{**values, "model": str(args.model or default_model()[0])})


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


def _serve_headless(args: argparse.Namespace) -> int:
    """A worker node's ranks alone (``--headless``): no API server."""
    import logging

    from kvserve.engine.executor.headless import run_headless

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = engine_config(args)
    except ValueError as exc:
        raise SystemExit(f"kvserve: {exc}") from exc
    return run_headless(config)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        if args.headless:
            return _serve_headless(args)
        if args.enable_auto_tool_choice and args.tool_call_parser is None:
            parser.error("--enable-auto-tool-choice requires --tool-call-parser")
        if args.collect_detailed_traces and args.otlp_traces_endpoint is None:
            parser.error("--collect-detailed-traces requires --otlp-traces-endpoint")
        from kvserve.server.serve import serve

        return serve(args)
    if args.command == "conformance":
        return run_conformance(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
