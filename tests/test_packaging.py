"""What a wheel (the serving image's install) holds: every package of the tree, which an
editable install finds whether it is listed or not."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_folder_with_an_init_is_a_listed_package():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {
        "kvserve." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("engine", "server", "conformance", "operator")
        for init in (ROOT / top).rglob("__init__.py")
    }
    # operator/ has no __init__.py on purpose (it would shadow the standard library's)
    assert listed == folders | {"kvserve", "kvserve.operator"}
