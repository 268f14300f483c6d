"""Structured outputs: output constraints, compiled to grammars, applied as token masks."""
