"""The pipeline runs one way: a stage imports only itself, the stages to its left and the shared
schema. Checked on the source's import statements (STYLE.md rule 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuaudit

SRC = Path(gpuaudit.__file__).parent

# rank of each top-level module; a module may import modules of equal or lower rank only
LAYERS: dict[str, int] = {
    "errors": 0, "schema": 0, "hardware": 0, "validate": 0, "__init__": 0, "_heap": 0,
    "measure": 1, "traces": 1,
    "classify": 2,
    "price": 3,
    "recommend": 4,
    "result": 5,
    "report": 6,
    "api": 7, "monitor": 8, "integrate": 8,
    "cli": 9, "__main__": 10,
}


def _layer(module: str) -> tuple[str, int]:
    top = module.split(".")[0]
    return top, LAYERS[top]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "gpuaudit":
                out += [(node.lineno, a.name) for a in node.names]
            elif node.module.startswith("gpuaudit."):
                out.append((node.lineno, node.module.removeprefix("gpuaudit.")))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.removeprefix("gpuaudit.")) for a in node.names
                    if a.name.startswith("gpuaudit.")]
    return out


def test_every_module_belongs_to_a_layer():
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        assert rel.parts[0] in LAYERS, f"{rel}: add it to LAYERS in this test"


def test_imports_point_left():
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        me, my_rank = _layer(".".join(rel.parts))
        for line, target in _imports(path):
            if target == "__version__":
                continue
            other, rank = _layer(target)
            if rank > my_rank and other != me:
                bad.append(f"{rel}.py:{line} imports gpuaudit.{target} ({other} is right of {me})")
    assert not bad, "\n".join(bad)


def test_public_api_is_small_and_declared():
    import gpuaudit.api
    import gpuaudit.classify
    import gpuaudit.price
    import gpuaudit.recommend
    import gpuaudit.schema

    for mod in (gpuaudit, gpuaudit.api, gpuaudit.classify, gpuaudit.price, gpuaudit.recommend,
                gpuaudit.schema):
        assert hasattr(mod, "__all__"), mod.__name__
        for name in mod.__all__:
            assert hasattr(mod, name), f"{mod.__name__}.{name} in __all__ but missing"
