"""The kernels floor (engine/kernels/) is the ground floor: its modules import only each
other, torch, triton, numpy and the standard library, never the layers, models, executor or
anything else of kvserve above them. Read from the sources, so an import inside a function
counts too."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "engine" / "kernels"
PACKAGE = "kvserve.engine.kernels"
THIRD_PARTY = frozenset({"torch", "triton", "numpy"})


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute name) of everything the module at ``path`` imports: ``import a.b``
    names ``a.b``, ``from a import b`` names ``a.b``, and a relative import is resolved
    against the module's package (``from .. import x`` names ``kvserve.engine.x``)."""
    package = ".".join([PACKAGE, *path.relative_to(KERNELS).parent.parts])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:  # level 1 is the package itself, 2 its parent, ...
                parts = package.split(".")
                base = ".".join(filter(None, [*parts[: len(parts) + 1 - node.level], node.module]))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def modules() -> list[Path]:
    paths = sorted(KERNELS.rglob("*.py"))
    assert paths, f"no modules under {KERNELS}"
    return paths


def test_the_kernels_floor_imports_no_kvserve_module_above_it():
    above = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in modules()
        for line, name in imported_modules(path)
        if name.split(".")[0] == "kvserve" and not (name + ".").startswith(PACKAGE + ".")
    ]
    assert not above, "imports from above the kernels floor:\n" + "\n".join(above)


def test_the_kernels_floor_imports_only_torch_triton_numpy_and_the_standard_library():
    others = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in modules()
        for line, name in imported_modules(path)
        if (top := name.split(".")[0]) != "kvserve"
        and top not in THIRD_PARTY
        and top not in sys.stdlib_module_names
    ]
    assert not others, "imports the kernels floor may not make:\n" + "\n".join(others)
