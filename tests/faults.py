"""Failures injected into a live engine, for the tests that check what they break."""

import os
import threading
import time


def fail_on(monkeypatch, obj, name: str, when) -> list:
    """Make ``obj.name`` raise when ``when(*args)`` is true; returns the failed calls'
    arguments (``when=lambda *_: not failed`` with that list fails the first call only)."""
    original = getattr(obj, name)
    failed = []

    def broken(*args, **kwargs):
        if when(*args):
            failed.append(args)
            raise RuntimeError(f"injected failure in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, broken)
    return failed


def slow_down(monkeypatch, obj, name: str, seconds: float) -> threading.Event:
    """Make every call of ``obj.name`` first spin for ``seconds`` in Python, holding the GIL
    as Python-heavy generation does (yielding it only at the interpreter's switch interval);
    returns an event that is set while a slowed call runs."""
    original = getattr(obj, name)
    running = threading.Event()

    def slow(*args, **kwargs):
        running.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        running.clear()
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, slow)
    return running


def gone(pid: int) -> bool:
    """No process ``pid`` exists any more (reaped, not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
