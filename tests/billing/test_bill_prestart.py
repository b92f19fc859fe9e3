"""``gpuaudit bill`` starts classify's worker ahead for a large telemetry recording, as
``gpuaudit report`` does: its imports run beside the command's and the bill's read, not
after them. Only with a telemetry file and more than one process allowed; the bill is the
same whether the worker came ahead, late or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaudit import _workers
from gpuaudit.cli import main


def _run(files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         *extra: str) -> tuple[list[str], dict[str, object]]:
    started: list[str] = []
    real = _workers.prestart

    def spy(path: Path | str) -> None:
        started.append(Path(path).name)
        real(path)

    monkeypatch.setattr(_workers, "prestart", spy)
    monkeypatch.setattr(_workers, "PRESTART_BYTES", 1)
    out = tmp_path / f"r{len(extra)}.json"
    rc = main(["bill", str(files["focus_csv"]), "--telemetry", str(files["telemetry"]),
               "--by", "team", "--format", "json", "-o", str(out), *extra])
    assert rc == 0
    proc = _workers.take()  # one the small telemetry did not need: ended here
    if proc is not None:
        proc.kill()
        proc.wait()
    doc = json.loads(out.read_text())
    doc.pop("generated_at", None)
    return started, doc


def test_the_bill_starts_the_telemetry_worker_ahead(files, tmp_path, monkeypatch):
    started, ahead = _run(files, tmp_path, monkeypatch)
    assert started == [files["telemetry"].name]
    started, alone = _run(files, tmp_path, monkeypatch, "--workers", "1")
    assert started == []  # one process asked for: no worker
    assert ahead == alone
