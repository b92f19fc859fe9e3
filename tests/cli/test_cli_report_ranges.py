"""`gpuaudit report` on a large recording: worker ranges and the folded timeline reach the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from gpuaudit.classify import classify, parallel
from gpuaudit.cli.report import _Counting
from gpuaudit.measure.files import open_samples
from gpuaudit.measure.parquet_io import write_recording
from gpuaudit.schema import Recording, build_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from coretables import series_table


def _recording(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    table: pa.Table = series_table({f"GPU-{g}": [float(v) for v in rng.integers(0, 101, 400)]
                                    for g in range(4)})
    table = build_table({name: table.column(name) for name in table.column_names})
    path = tmp_path / "big.parquet"
    write_recording(Recording(table=table, source="test", origin="t", interval_s=1.0), path,
                    row_group_rows=200)
    return path


def test_progress_wrapper_passes_ranges_through_and_counts_all_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "_start", lambda *a, **k: None)  # ranges in this process
    path = _recording(tmp_path)
    seen: list[float] = []
    wrapped = _Counting(open_samples(path), seen.append)
    assert wrapped.num_rows == 1600 and wrapped.ts_range_ns is not None
    usage = classify(wrapped, workers=2)
    direct = classify(open_samples(path), workers=1)
    assert usage.overall().total_s == direct.overall().total_s
    assert usage.timeline is not None
    # the first of two equal ranges, counted twice: the bar reaches the file's row count
    assert sum(seen) == 1600


def test_report_json_carries_the_timeline_from_the_single_pass(tmp_path):
    from click.testing import CliRunner

    from gpuaudit.cli import cli

    path = _recording(tmp_path)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(cli, ["report", str(path), "--price", "2.00", "--format", "json",
                                   "-o", str(out)])
    assert res.exit_code == 0, res.output
    tl = json.loads(out.read_text())["extra"]["timeline"]
    assert [g["gpu_uuid"] for g in tl["gpus"]] == [f"GPU-{g}" for g in range(4)]
    assert sum(tl["histogram"]["seconds"]) == 1600.0


def test_report_workers_flag_gives_the_same_report(tmp_path):
    from click.testing import CliRunner

    from gpuaudit.cli import cli

    path = _recording(tmp_path)
    outs = []
    for workers in ("1", "3"):
        out = tmp_path / f"r{workers}.json"
        res = CliRunner().invoke(cli, ["report", str(path), "--price", "2.00", "--workers",
                                       workers, "--format", "json", "-o", str(out)])
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        doc.pop("generated_at")
        outs.append(doc)
    assert outs[0]["phases"] == outs[1]["phases"] and outs[0]["cost"] == outs[1]["cost"]
    assert outs[0]["extra"]["timeline"] == outs[1]["extra"]["timeline"]
    bad = CliRunner().invoke(cli, ["report", str(path), "--workers", "0"])
    assert bad.exit_code != 0 and "--workers" in bad.output
