"""The ``fetch-model`` init container's program: download an ``hf://`` repository into the
model directory; on failure, leave one line that names the cause as the termination message.

    python -c SOURCE REPO_ID REVISION DIRECTORY      (REVISION '' = the repository's default)

It runs in whatever image the spec names, so it imports only the standard library and
huggingface_hub (which honours ``HF_ENDPOINT``, ``HF_TOKEN`` and the proxy variables): the
operator passes this file's source to ``python -c`` (``deployment.FETCH_SCRIPT``) instead of
naming a module the image may not have.

The kubelet copies ``/dev/termination-log`` (at most 4096 bytes) into the container's
``state.terminated.message``, which the ``ModelLoaded`` condition quotes. The line names the
repository, the endpoint and the innermost exception of the error's chain, where the cause is
(huggingface_hub wraps it: a name that does not resolve comes as ``LocalEntryNotFoundError``),
e.g. ``cannot download org/name from http://hub.invalid: [Errno -3] Temporary failure in name
resolution (raised as LocalEntryNotFoundError)``. The whole traceback still goes to the log.
"""

import sys
import traceback
from pathlib import Path

from huggingface_hub import constants, snapshot_download

TERMINATION_LOG = Path("/dev/termination-log")
MAX_CHARS = 1000
"""Longer lines are cut: a cause's first line fits, and the kubelet keeps 4096 bytes."""


def innermost(error: BaseException) -> BaseException:
    """The last exception of ``error``'s chain, followed as a traceback prints it (the explicit
    cause, else the context unless suppressed)."""
    seen = {id(error)}
    while True:
        inner = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
        if inner is None or id(inner) in seen:
            return error
        seen.add(id(inner))
        error = inner


def failure_line(repo_id: str, revision: str, endpoint: str, error: BaseException) -> str:
    """One line: what could not be downloaded from where, the cause's first line, and the type
    huggingface_hub raised it as (``RevisionNotFoundError``, ``GatedRepoError``, ...).

    The cause's type comes first unless its message is an errno's (``[Errno -3] Temporary
    failure in name resolution``), which names itself: which class carries it (``gaierror``,
    or the HTTP library's ``ConnectError`` when it does not chain the socket's error) varies
    with the failure and the library's version, not with the cause."""
    cause = innermost(error)
    text = next((line.strip() for line in str(cause).splitlines() if line.strip()), "")
    what = f"{repo_id}@{revision}" if revision else repo_id
    if not text.startswith("[Errno "):
        text = f"{type(cause).__name__}: {text}" if text else type(cause).__name__
    line = f"cannot download {what} from {endpoint}: {text}"
    if cause is not error:
        line += f" (raised as {type(error).__name__})"
    return line[:MAX_CHARS]


def main(argv: list[str], termination_log: Path = TERMINATION_LOG) -> int:
    repo_id, revision, directory = argv
    try:
        snapshot_download(repo_id=repo_id, revision=revision or None, local_dir=directory)
    except Exception as e:
        traceback.print_exc()
        line = failure_line(repo_id, revision, constants.ENDPOINT, e)
        termination_log.write_text(line + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
