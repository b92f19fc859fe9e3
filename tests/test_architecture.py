"""The pipeline runs one way: a stage imports only itself, the stages to its left and the shared
schema. Checked on the source's import statements (STYLE.md rule 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import gpuaudit

SRC = Path(gpuaudit.__file__).parent

# rank of each top-level module; a module may import modules of equal or lower rank only
LAYERS: dict[str, int] = {
    "errors": 0, "schema": 0, "units": 0, "hardware": 0, "promql": 0, "validate": 0,
    "limits": 0, "__init__": 0, "_heap": 0, "_workers": 0, "series": 0,
    "measure": 1, "traces": 1,
    "classify": 2,
    "price": 3,
    "capacity": 4,
    "recommend": 5,
    "result": 6,
    "report": 7,
    "api": 8, "monitor": 9, "integrate": 9,
    "cli": 10, "__main__": 11,
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


def _type_checking_lines(path: Path) -> set[int]:
    """The lines inside ``if TYPE_CHECKING:`` blocks of a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and \
                node.test.id == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


#: the package root: the public facade. It names every entry point for type checkers under
#: TYPE_CHECKING and loads them lazily (``__getattr__``) at run time, so ``import gpuaudit``
#: loads no stage; outside TYPE_CHECKING it imports nothing of ours.
FACADE = SRC / "__init__.py"


def test_the_package_root_imports_only_for_type_checkers():
    typing_only = _type_checking_lines(FACADE)
    assert typing_only, "gpuaudit/__init__.py declares its lazy names under TYPE_CHECKING"
    loaded = [f"__init__.py:{line} imports gpuaudit.{target}"
              for line, target in _imports(FACADE) if line not in typing_only]
    assert not loaded, "\n".join(loaded)


def test_imports_point_left():
    bad = []
    facade_typing = _type_checking_lines(FACADE)
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        me, my_rank = _layer(".".join(rel.parts))
        for line, target in _imports(path):
            if target == "__version__" or (path == FACADE and line in facade_typing):
                continue
            other, rank = _layer(target)
            if rank > my_rank and other != me:
                bad.append(f"{rel}.py:{line} imports gpuaudit.{target} ({other} is right of {me})")
    assert not bad, "\n".join(bad)


#: The sources. The stages after them (classify, price, recommend, result, report) work on
#: what a source produced (the sample table, a SeriesId, a client protocol they define) and
#: never import a source; only the compositions (api, monitor, integrate, cli) open sources.
SOURCES = ("measure", "traces")
COMPOSITIONS_FROM_RANK = LAYERS["api"]


def _source_imports_outside_compositions(src: Path) -> list[str]:
    bad = []
    for path in src.rglob("*.py"):
        rel = path.relative_to(src).with_suffix("")
        me, my_rank = _layer(".".join(rel.parts))
        if me in SOURCES or my_rank >= COMPOSITIONS_FROM_RANK:
            continue
        for line, target in _imports(path):
            other = target.split(".")[0]
            if other in SOURCES:
                bad.append(f"{rel}.py:{line} imports gpuaudit.{target}: stage {me} must not "
                           f"import a source; take the data (or a client protocol) as an "
                           f"argument and let api/cli pass the source in")
    return bad


def test_stages_never_import_a_source():
    bad = _source_imports_outside_compositions(SRC)
    assert not bad, "\n".join(bad)


def test_the_source_rule_catches_classify_importing_measure(tmp_path):
    pkg = tmp_path / "gpuaudit"
    (pkg / "classify").mkdir(parents=True)
    (pkg / "classify" / "pushdown.py").write_text(
        "from gpuaudit.measure.fleet.dcgm import SeriesId\nfrom gpuaudit.schema import ImportNote\n")
    (pkg / "api.py").write_text("from gpuaudit.measure.files import open_samples\n")
    assert _source_imports_outside_compositions(pkg) == [
        "classify/pushdown.py:1 imports gpuaudit.measure.fleet.dcgm: stage classify must not import "
        "a source; take the data (or a client protocol) as an argument and let api/cli pass "
        "the source in"]


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


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


def _module_graph() -> dict[str, set[str]]:
    """Module -> the gpuaudit modules it imports anywhere (top level, in functions, and under
    TYPE_CHECKING alike: a reader must hold both ends of any of them in mind)."""
    mods = {_module_of(p): p for p in SRC.rglob("*.py")}

    def resolve(target: str) -> str | None:
        parts = target.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in mods:
                return ".".join(parts[:i])
        return None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for me, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                    node.module == "gpuaudit" or node.module.startswith("gpuaudit.")):
                base = node.module.removeprefix("gpuaudit").lstrip(".")
                for alias in node.names:
                    full = f"{base}.{alias.name}".lstrip(".")
                    targets.append(full if full in mods else base)
            elif isinstance(node, ast.Import):
                targets += [a.name.removeprefix("gpuaudit.") for a in node.names
                            if a.name.startswith("gpuaudit.")]
            for target in targets:
                mod = resolve(target) if target else None
                if mod is not None and mod != me:
                    graph[me].add(mod)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


#: Import loops kept on purpose, each with its reason. ``Sampler(backend, process=True)`` is
#: public API that returns the process-mode subclass, so the base class names its subclass.
KNOWN_LOOPS = [["measure.live.sampler", "measure.live.sampler_process"]]


def test_no_module_import_loops():
    loops = _cycles(_module_graph())
    unexpected = [loop for loop in loops if loop not in KNOWN_LOOPS]
    assert not unexpected, "modules that import each other: " + "; ".join(
        " <-> ".join(loop) for loop in unexpected)


def test_the_loop_finder_finds_loops():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


#: what the CLI may not import (function-level imports included): the stages a command would
#: compose itself; compositions live in gpuaudit.api, the CLI only parses options and renders
CLI_FORBIDDEN = ("price", "recommend", "capacity", "traces")


def _cli_stage_imports(src: Path) -> list[str]:
    bad = []
    for path in sorted((src / "cli").rglob("*.py")):
        rel = path.relative_to(src)
        for line, target in _imports(path):
            if target.split(".")[0] in CLI_FORBIDDEN:
                bad.append(f"{rel}:{line} imports gpuaudit.{target}: compose it in a "
                           f"gpuaudit.api function and call that")
    return bad


def test_cli_only_parses_and_renders():
    bad = _cli_stage_imports(SRC)
    assert not bad, "\n".join(bad)


def test_the_cli_rule_catches_a_function_level_import(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "x.py").write_text(
        "import click\n\n\ndef f():\n    from gpuaudit.capacity.rightsize import rightsize\n"
        "    import gpuaudit.traces.loader\n    from gpuaudit import price\n")
    assert _cli_stage_imports(tmp_path) == [
        "cli/x.py:5 imports gpuaudit.capacity.rightsize: compose it in a gpuaudit.api "
        "function and call that",
        "cli/x.py:6 imports gpuaudit.traces.loader: compose it in a gpuaudit.api function "
        "and call that",
        "cli/x.py:7 imports gpuaudit.price: compose it in a gpuaudit.api function and call "
        "that"]
