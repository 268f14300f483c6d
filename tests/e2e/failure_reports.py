"""What an e2e failure leaves to read: the full diagnostics beside the failure, and a brief
copy printed again at the very end of the run (``conftest.pytest_terminal_summary``), since a
CI log is often kept only by its tail."""

import sys

from scenarios import Context, diagnostics

BRIEF: list[tuple[str, str]] = []
"""(test, brief diagnostics) of each failed e2e test, in the order they failed."""
BRIEF_CHARS = 4000
"""The most of each brief report printed at the end: its last characters."""


def report_failure(test: str, ctx: Context) -> None:
    """Print the full diagnostics to stderr now; keep the brief ones for the end."""
    print(diagnostics(ctx), file=sys.stderr)
    BRIEF.append((test, diagnostics(ctx, brief=True)[-BRIEF_CHARS:]))
