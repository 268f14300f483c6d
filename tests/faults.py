"""Failures injected into a live engine, for the tests that check what they break."""


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
