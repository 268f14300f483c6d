"""Which JSON-schema keywords the grammar cannot enforce, so that a schema using them is
refused instead of producing output that does not validate."""

from typing import Any

# xgrammar 0.2.9 compiles these without enforcing them (measured: an output it accepts
# fails the schema). ``allOf`` is enforced with one subschema only.
UNENFORCED = ("not", "if", "then", "else", "contains", "minContains", "maxContains",
              "unevaluatedProperties")  # fmt: skip
# Keywords whose value maps names (not keywords) to subschemas.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Keywords whose value is data, never a schema.
_DATA = ("enum", "const", "default", "examples", "required", "dependentRequired")


def unenforced_keyword(schema: Any, path: str = "") -> str | None:
    """The first keyword in ``schema`` (or a subschema) the grammar cannot enforce, as
    ``'keyword' at /json/pointer``; ``None`` when there is none."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            if found := unenforced_keyword(item, f"{path}/{i}"):
                return found
        return None
    if not isinstance(schema, dict):
        return None
    for keyword, value in schema.items():
        where = f"{path}/{keyword}"
        if keyword in UNENFORCED or (keyword == "uniqueItems" and value is True):
            return f"'{keyword}' at {where}"
        if keyword == "allOf" and isinstance(value, list) and len(value) > 1:
            return f"'allOf' with more than one subschema at {where}"
        if keyword in _DATA:
            continue
        if keyword in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                if found := unenforced_keyword(sub, f"{where}/{name}"):
                    return found
        elif found := unenforced_keyword(value, where):
            return found
    return None
