"""The ``kvserve serve`` flags the operator owns, which ``spec.extraArgs`` may not set.

``extraArgs`` come last on the command line, and the last value of a flag wins, so an extra
``--port 9000`` used to move the server away from the port the probes, the Service and the
InferencePool point at. The operator owns every flag it renders, whether or not a given spec
renders it, and each has one place in the spec (or is fixed):

- ``--host``, ``--port``: fixed (0.0.0.0, ``HTTP_PORT``); the probes, the Service, the
  container port and the scrape annotations name that port;
- ``--model``: ``model.source`` (the volume or init container the pod gets follows from it);
- ``--served-model-name``: ``model.servedName`` (also the KV-events topic's model);
- ``--device``: ``resources.gpus`` (the pod's GPU request);
- ``--shutdown-timeout``: ``drain.timeoutSeconds`` (the termination grace period covers it);
- ``--kv-events-config``: ``engine.kvEvents`` (its container port and ``POD_NAME``);
- ``--speculative-config``: ``engine.speculativeConfig``;
- ``--enable-lora``, ``--lora-modules``, ``--allow-runtime-lora-updating``: ``adapters``
  (``adapters``: the ``hf://`` ones are started with, the others loaded at run time, which the
  last one allows);
- ``--pipeline-parallel-size``: ``engine.pipelineParallelSize``; ``--nnodes``, ``--node-rank``,
  ``--master-addr``, ``--master-port``, ``--headless``: the LeaderWorkerSet's group
  (``leader_worker_set``);
- ``--api-key``: ``apiKeySecret`` (as a flag it would beat the Secret's ``KVSERVE_API_KEY``,
  in plain text in the pod's spec);
- every setting of the CRD's ``engine`` block (``CRD_ENGINE_SETTINGS``: ``--dtype``,
  ``--tensor-parallel-size``, ..., with their ``--no-`` forms and companion flags such as
  ``--enable-auto-tool-choice``): ``engine.<name>``; the operator checks some against the rest
  of the spec (tensor-parallel size against GPUs, shared memory sized by it).

Approach: refuse, never drop or reorder. A spec whose ``extraArgs`` name an owned flag is
``Degraded`` with a message naming each such flag and where it is set, as any invalid spec is.
A flag is recognised in every spelling the server's parser accepts: ``--port 9000``,
``--port=9000``, and an unambiguous prefix (``--por=9000``; argparse's abbreviations). Every
other flag passes here, and the server's own parser still judges it (``server_args``).
"""

from collections.abc import Sequence

from kvserve.operator.resource import HTTP_PORT
from kvserve.server.server_settings import CRD_ENGINE_SETTINGS, SERVE_SETTINGS

FIXED: dict[str, str] = {
    "--model": "set by spec.model.source",
    "--served-model-name": "set by spec.model.servedName",
    "--host": "always 0.0.0.0",
    "--port": f"always {HTTP_PORT}",
    "--device": "set by spec.resources.gpus",
    "--shutdown-timeout": "set by spec.drain.timeoutSeconds",
    "--kv-events-config": "set by spec.engine.kvEvents",
    "--speculative-config": "set by spec.engine.speculativeConfig",
    "--api-key": "set by spec.apiKeySecret",
    "--enable-lora": "set by spec.adapters",
    "--no-enable-lora": "set by spec.adapters",
    "--lora-modules": "set by spec.adapters",
    "--allow-runtime-lora-updating": "set by spec.adapters",
    "--no-allow-runtime-lora-updating": "set by spec.adapters",
    "--pipeline-parallel-size": "set by spec.engine.pipelineParallelSize",
    "--nnodes": "set by the LeaderWorkerSet's group size",
    "--node-rank": "set by the LeaderWorkerSet's worker index",
    "--master-addr": "set by the LeaderWorkerSet's leader address",
    "--master-port": "always the LeaderWorkerSet leader's rendezvous port",
    "--headless": "set on the LeaderWorkerSet's workers",
}
"""The owned flags outside the CRD's ``engine`` settings, and where each is set."""


def _spellings(flag: str, boolean: bool) -> list[str]:
    """``flag``, and its ``--no-`` form for a boolean (argparse.BooleanOptionalAction)."""
    return [flag, "--no-" + flag.removeprefix("--")] if boolean else [flag]


def _owned() -> dict[str, str]:
    owned = dict(FIXED)
    for d in CRD_ENGINE_SETTINGS:
        companions = d.setting.crd.with_flags if d.setting.crd is not None else ()
        spellings = _spellings(d.flag, d.kind is bool)
        spellings += [s for flag in companions for s in _spellings(flag, boolean=True)]
        owned |= dict.fromkeys(spellings, f"set by spec.engine.{d.crd_name}")
    return owned


OWNED = _owned()
"""Each owned flag (every spelling but abbreviations) → where its value comes from."""
_SERVE_OPTIONS = ["--help"] + [
    s for d in SERVE_SETTINGS for s in _spellings(d.flag, d.kind is bool)
]
"""Every option string of ``kvserve serve``, as its parser (``server.cli``) builds them."""


def _option(arg: str) -> str | None:
    """The ``serve`` option ``arg`` names, as argparse resolves it: exactly, or by the one
    option it is a prefix of (before any ``=``); None for a value, an unknown or an ambiguous
    option (the server's parser reports those)."""
    if not arg.startswith("--") or arg == "--":
        return None
    given = arg.partition("=")[0]
    if given in _SERVE_OPTIONS:
        return given
    matches = [o for o in _SERVE_OPTIONS if o.startswith(given)]
    return matches[0] if len(matches) == 1 else None


def owned_flags_problem(extra_args: Sequence[str]) -> str | None:
    """Why ``extra_args`` cannot be appended to the operator's flags, or None when they can."""
    found: list[str] = []
    for arg in extra_args:
        if arg == "--":  # the rest are positional arguments
            break
        option = _option(arg)
        if option in OWNED and option not in found:
            found.append(option)
    if not found:
        return None
    named = ", ".join(f"{flag} ({OWNED[flag]})" for flag in found)
    return f"spec.extraArgs may not set flags the operator renders: {named}"
