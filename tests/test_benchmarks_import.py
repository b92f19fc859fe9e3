"""Every benchmark script still imports: a moved function (audit_fleet left cli/ for the api
layer) must not leave a benchmark that fails only when someone runs it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
#: runs inside HolisticTraceAnalysis' own environment (the peer tool it compares against)
PEER_ENV = {"hta_compare.py"}


@pytest.mark.parametrize("path", sorted(p for p in BENCH.glob("*.py") if p.name not in PEER_ENV), ids=lambda p: p.name)
def test_benchmark_imports(path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # runs only definitions: each script's work is in main()
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
