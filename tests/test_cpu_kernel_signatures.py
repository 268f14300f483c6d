"""The C entry points' signatures (cpu_signatures.SIGNATURES) are their prototypes in csrc/, name
for name and type for type; a call names every argument, and a wrong one is an error that
names it."""

import ctypes
import re

import pytest
import torch

from kvserve.engine.kernels import cpu_library
from kvserve.engine.kernels.cpu_signatures import SIGNATURES

# An entry point: a C function returning int at the start of a line (the helpers are static
# or return void); its parameters have no parentheses.
ENTRY_POINT = re.compile(r"^int (\w+)\(([^)]*)\)\s*\{", re.MULTILINE)
CTYPES = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}


def prototypes() -> list[tuple[str, tuple[tuple[str, type], ...]]]:
    """(name, ((parameter, ctype), ...)) of every entry point defined in csrc/*.c, each
    definition once (a function defined in both branches of an #if is listed twice)."""
    found = []
    for source in cpu_library.sources():
        if source.suffix != ".c":
            continue
        for name, params in ENTRY_POINT.findall(source.read_text()):
            pairs = []
            for param in params.split(","):
                if param.strip() in ("void", ""):
                    continue
                ctype, param_name = re.fullmatch(r"(.*?)(\w+)", param.strip()).groups()
                if "*" in ctype:
                    pairs.append((param_name, ctypes.c_void_p))
                else:
                    pairs.append((param_name, CTYPES[ctype.replace("const", "").strip()]))
            found.append((name, tuple(pairs)))
    return found


def test_every_entry_point_has_the_signature_of_its_prototype():
    found = prototypes()
    assert {name for name, _ in found} == set(SIGNATURES)
    for name, params in found:
        assert SIGNATURES[name].params == params, name


def test_a_call_missing_an_argument_or_naming_an_unknown_one_names_it():
    args = {name: 0 for name in SIGNATURES["row_argmax"].names}
    missing = {k: v for k, v in args.items() if k != "cols"}
    with pytest.raises(TypeError, match=r"^row_argmax\(\): missing \['cols'\], unknown \[\]$"):
        cpu_library.run("row_argmax", **missing)
    with pytest.raises(TypeError, match=r"missing \['cols'\], unknown \['columns'\]$"):
        cpu_library.run("row_argmax", **missing, columns=0)
    with pytest.raises(TypeError, match=r"missing \[\], unknown \['threads'\]$"):
        cpu_library.run("row_argmax", **args, threads=1)


@pytest.mark.skipif(not cpu_library.available(), reason="needs the C kernels")
def test_an_argument_of_the_wrong_type_is_named():
    x, out = torch.zeros(1, 4), torch.zeros(1, dtype=torch.int64)
    args = dict(x=x.data_ptr(), out=out.data_ptr(), rows=1, cols=4, row_stride=4, num_threads=1)
    with pytest.raises(TypeError, match=r"^row_argmax\(\): isa takes a c_int: "):
        cpu_library.run("row_argmax", **args, isa="avx2")
    cpu_library.run("row_argmax", **args, isa=cpu_library.ISAS["baseline"])
