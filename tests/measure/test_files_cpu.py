"""CPU columns from files (issue 21): `--map cpu_util_pct=host_cpu_util_pct` in CSV and JSONL,
a ratio-scaled column declared as such, Parquet by name, a gpuaudit recording round trip, and
a value out of range refused naming the column and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuaudit.classify import classify
from gpuaudit.errors import InputError, SampleTableError
from gpuaudit.measure.files import parse_mapping, read_samples
from gpuaudit.measure.parquet_io import write_recording

ROWS = [  # time, gpu, GPU util, host CPU %, the job's CPU as a ratio of all cores
    ("2025-01-01T00:00:00Z", 0, 95.0, 20.0, 0.10),
    ("2025-01-01T00:00:01Z", 0, 0.0, 96.0, 0.80),
    ("2025-01-01T00:00:02Z", 0, 0.0, 94.0, 0.85),
    ("2025-01-01T00:00:03Z", 0, 95.0, 22.0, None),
]
MAP = "time=ts,gpu=gpu_index,util=util_gpu_pct,cpu_util_pct=host_cpu_util_pct," \
      "job_cpu=proc_cpu_util_pct:ratio"


def _check(rec) -> None:  # type: ignore[no-untyped-def]
    t = rec.table
    assert t.column("host_cpu_util_pct").to_pylist() == [20.0, 96.0, 94.0, 22.0]
    assert t.column("proc_cpu_util_pct").to_pylist() == pytest.approx([10.0, 80.0, 85.0, None])
    s = classify(rec).series[0]
    assert s.host_cpu_util_pct_while_idle == pytest.approx(95.0)
    assert s.host_cpu_util_pct_while_busy == pytest.approx(21.0)


def test_csv_with_map(tmp_path: Path) -> None:
    p = tmp_path / "gpu_cpu.csv"
    p.write_text("time,gpu,util,cpu_util_pct,job_cpu\n" + "".join(
        f"{t},{g},{u},{c},{'' if j is None else j}\n" for t, g, u, c, j in ROWS))
    _check(read_samples(p, mapping=parse_mapping(MAP), host="n1"))


def test_jsonl_with_map(tmp_path: Path) -> None:
    p = tmp_path / "gpu_cpu.jsonl"
    p.write_text("".join(json.dumps({"time": t, "gpu": g, "util": u, "cpu_util_pct": c,
                                     "job_cpu": j}) + "\n" for t, g, u, c, j in ROWS))
    _check(read_samples(p, mapping=parse_mapping(MAP), host="n1"))


def test_foreign_parquet_by_name_and_recording_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({
        "ts": pa.array([r[0] for r in ROWS]).cast(pa.timestamp("s", "UTC")),
        "gpu_index": [r[1] for r in ROWS], "util_gpu_pct": [r[2] for r in ROWS],
        "host_cpu_util_pct": [r[3] for r in ROWS],
        "proc_cpu_util_pct": [None if r[4] is None else 100 * r[4] for r in ROWS]}), p)
    rec = read_samples(p, host="n1")
    _check(rec)
    out = tmp_path / "rec.parquet"
    write_recording(rec, out)
    again = read_samples(out)
    assert again.table.column("host_cpu_util_pct").equals(rec.table.column("host_cpu_util_pct"))
    _check(again)


def test_cpu_above_100_is_refused_with_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("time,gpu,util,cpu_util_pct\n2025-01-01T00:00:00Z,0,50,20\n"
                 "2025-01-01T00:00:01Z,0,50,340\n")
    with pytest.raises((SampleTableError, InputError)) as exc:
        read_samples(p, mapping=parse_mapping("time=ts,gpu=gpu_index,util=util_gpu_pct,"
                                              "cpu_util_pct=host_cpu_util_pct"), host="n1")
    msg = str(exc.value)
    assert "host_cpu_util_pct" in msg and "bad.csv:3" in msg, msg
