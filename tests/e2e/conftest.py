"""The e2e tests reuse the operator tests' kubectl and helm (fetched once into the cache);
each failure's brief diagnostics are printed again at the end of the run."""

import sys

import pytest
from k8s.conftest import kube_tools  # noqa: F401
from k8s.support import ROOT

sys.path.insert(0, str(ROOT / "e2e"))
from failure_reports import BRIEF


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for test, text in BRIEF:
        terminalreporter.write_sep("-", f"e2e diagnostics of {test} (brief; the full ones above)")
        terminalreporter.write_line(text)
