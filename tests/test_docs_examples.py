"""Every ``python`` block of docs/python-api.md and README.md type-checks under
``mypy --strict`` and pyright, and runs on the bundled data (issue 26 part 2: a notebook user
can do everything the CLI does with typed calls, and the documented calls are the real ones).

A block preceded by ``<!-- not run: why -->`` needs a live server or a GPU: it is type-checked
only. Blocks run as their own process from the repository root, so the paths they name are the
repository's (src/gpuaudit/data, tests/data)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCS = (ROOT / "docs" / "python-api.md", ROOT / "README.md")
_BLOCK = re.compile(r"(?:<!--\s*not run:(?P<why>[^>]*)-->\s*\n)?```python\n(?P<code>.*?)```",
                    re.S)


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    code: str
    run: bool

    @property
    def name(self) -> str:
        return f"{self.doc.stem.lower().replace('-', '_')}_l{self.line}"


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text()
    return [Block(doc, text[:m.start("code")].count("\n") + 1, m["code"], m["why"] is None)
            for m in _BLOCK.finditer(text)]


ALL = [b for d in DOCS for b in blocks(d)]


def test_the_docs_have_a_runnable_example_per_entry_point():
    api = [b for b in ALL if b.doc.name == "python-api.md"]
    for call in ("audit(", "audit_fleet(", "audit_queue(", "bill(", "rightsize(",
                 "simulate(", "trace(", "kernel_summary(", "monitor("):
        assert any(f"gpuaudit.{call}" in b.code for b in api), call
    ran = " ".join(b.code for b in api if b.run)
    for call in ("audit(", "audit_fleet(", "rightsize(", "simulate(", "trace(",
                 "kernel_summary("):
        assert f"gpuaudit.{call}" in ran, call


def test_the_block_finder_sees_markers(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("a\n```python\nx = 1\n```\n<!-- not run: needs a GPU -->\n```python\n"
                   "y = 2\n```\n```bash\nz\n```\n")
    assert [(b.line, b.code, b.run) for b in blocks(doc)] == [(3, "x = 1\n", True),
                                                               (7, "y = 2\n", False)]


def _write(tmp_path: Path) -> list[Path]:
    files = []
    for b in ALL:
        p = tmp_path / f"{b.name}.py"
        p.write_text(b.code)
        files.append(p)
    return files


def _where(out: str, tmp_path: Path) -> str:
    # file.py:LINE -> the doc and its line
    by_name = {b.name: b for b in ALL}

    def sub(m: re.Match[str]) -> str:
        b = by_name[m[1]]
        return f"{b.doc.relative_to(ROOT)}:{b.line + int(m[2]) - 1}"

    names = "|".join(map(re.escape, by_name))
    return re.sub(rf"(?:{re.escape(str(tmp_path))}/)?\b({names})\.py:(\d+)", sub, out)


def test_examples_pass_mypy_strict(tmp_path):
    files = _write(tmp_path)
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
                        "--cache-dir", str(tmp_path / ".mypy_cache"), *map(str, files)],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, _where(r.stdout + r.stderr, tmp_path)


def test_examples_pass_pyright(tmp_path):
    pyright = shutil.which("pyright", path=str(Path(sys.executable).parent))
    assert pyright, "pyright is in the test extra (pip install -e '.[test]')"
    files = _write(tmp_path)
    r = subprocess.run([pyright, "--pythonpath", sys.executable, *map(str, files)],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, _where(r.stdout + r.stderr, tmp_path)


@pytest.mark.parametrize("block", [b for b in ALL if b.run], ids=lambda b: b.name)
def test_example_runs(block, tmp_path):
    p = tmp_path / f"{block.name}.py"
    p.write_text(block.code)
    r = subprocess.run([sys.executable, str(p)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, _where(r.stdout + r.stderr, tmp_path)
