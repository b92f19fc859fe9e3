"""File importers on real and real-derived logs: every format variant lands in the table."""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gpuaudit.errors import InputError, SampleTableError
from gpuaudit.measure.files import open_samples, parse_mapping, read_samples
from gpuaudit.schema import SAMPLE_SCHEMA, SampleSource

DATA = Path(__file__).parents[1] / "data"
SMI = DATA / "nvidia_smi"
NANOGPT = SMI / "nanogpt_8xh100_nvidia_smi.csv"
FIELDS = ("timestamp,index,name,utilization.gpu,memory.used,memory.total,power.draw,"
          "temperature.gpu,clocks.sm,clocks_event_reasons.active,"
          "ecc.errors.uncorrected.volatile.total").split(",")


def _real_rows() -> list[dict[str, str]]:
    with NANOGPT.open() as f:
        return list(csv.DictReader(f))


def _reasons(notes: tuple[object, ...]) -> str:
    return "\n".join(getattr(n, "reason", "") for n in notes)


def test_nanogpt_log_end_to_end() -> None:
    rows = _real_rows()
    rec = read_samples(NANOGPT)
    t = rec.table
    assert t.schema == SAMPLE_SCHEMA
    assert t.num_rows == len(rows)
    assert rec.source == "nvidia-smi-csv"
    assert str(NANOGPT) in rec.origin
    assert sorted(pc.unique(t.column("gpu_index")).to_pylist()) == list(range(8))
    # interval: median gap per GPU, recomputed here from the raw text
    gaps = []
    for g in range(8):
        ts = [dt.datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp()
              for r in rows if int(r["gpu_index"]) == g]
        gaps.extend(np.diff(ts))
    assert rec.interval_s == pytest.approx(float(np.median(gaps)), abs=1e-3)
    assert 0.25 < (rec.interval_s or 0) < 0.4
    # values match the text cell for cell
    util = np.array([float(r["utilization_gpu_percent"]) for r in rows], dtype=np.float32)
    power = np.array([float(r["power_W"]) for r in rows], dtype=np.float32)
    temp = np.array([float(r["temperature_C"]) for r in rows], dtype=np.float32)
    np.testing.assert_array_equal(t.column("util_gpu_pct").to_numpy(), util)
    np.testing.assert_array_equal(t.column("power_w").to_numpy(), power)
    np.testing.assert_array_equal(t.column("temp_c").to_numpy(), temp)
    first = dt.datetime.fromisoformat(rows[0]["timestamp"].replace("Z", "+00:00"))
    assert t.column("ts")[0].as_py() == first
    # identity derived and said so; no model -> null and said so
    assert t.column("gpu_uuid")[3].as_py() == "nanogpt_8xh100_nvidia_smi/gpu3"
    assert t.column("gpu_model").null_count == t.num_rows
    text = _reasons(rec.notes)
    assert "gpu_uuid derived" in text and "no GPU model" in text and "host" in text


def test_nanogpt_host_and_model_given() -> None:
    rec = read_samples(NANOGPT, host="vp-h100-01", gpu_model="NVIDIA H100 80GB HBM3")
    assert set(rec.table.column("host").to_pylist()) == {"vp-h100-01"}
    assert set(rec.table.column("gpu_model").to_pylist()) == {"NVIDIA H100 80GB HBM3"}
    assert rec.table.column("gpu_uuid")[0].as_py() == "vp-h100-01/gpu0"
    assert "no GPU model" not in _reasons(rec.notes)


def test_source_protocol_and_bounded_batches() -> None:
    src = open_samples(NANOGPT, batch_rows=500)
    assert isinstance(src, SampleSource)
    sizes = [b.num_rows for b in src.batches()]
    assert sum(sizes) == 6240 and len(sizes) > 3
    assert all(b.schema == SAMPLE_SCHEMA for b in open_samples(NANOGPT).batches())
    # a source re-reads from the start
    assert sum(b.num_rows for b in src.batches()) == 6240


@pytest.mark.parametrize("name", ["smi_units.csv", "smi_nounits.csv", "smi_noheader.csv"])
def test_units_nounits_noheader_agree(name: str) -> None:
    ref = read_samples(SMI / "smi_units.csv").table
    rec = read_samples(SMI / name, fields=FIELDS if "noheader" in name else None,
                       host="smi_units")
    t = rec.table
    for col in ("ts", "gpu_index", "util_gpu_pct", "mem_used_mib", "mem_total_mib", "power_w",
                "temp_c", "sm_clock_mhz", "clocks_event_reasons", "ecc_dbe_total",
                "gpu_model"):
        assert t.column(col).to_pylist() == ref.column(col).to_pylist(), col
    assert t.column("mem_total_mib")[0].as_py() == 81559.0
    assert t.column("sm_clock_mhz")[0].as_py() == 1980.0
    assert t.column("clocks_event_reasons").to_pylist()[:2] == [1, 4]
    assert "assumed UTC" in _reasons(rec.notes)


def test_units_values_match_real_rows() -> None:
    rows = _real_rows()[:24]
    t = read_samples(SMI / "smi_units.csv").table
    np.testing.assert_array_equal(
        t.column("power_w").to_numpy(), np.array([float(r["power_W"]) for r in rows], np.float32))
    assert t.column("gpu_model")[0].as_py() == "NVIDIA H100 80GB HBM3"


def test_na_cells_are_null_and_counted() -> None:
    rec = read_samples(SMI / "smi_na.csv")
    t = rec.table
    assert t.column("power_w").null_count == 6
    assert t.column("ecc_dbe_total").null_count == 6
    assert t.column("mem_used_mib").null_count == 6
    assert t.column("power_w")[1].as_py() is None  # line 3 holds [N/A]
    na = [n for n in rec.notes if "null" in n.reason]
    assert sorted(n.count for n in na) == [6, 6, 6]
    assert {n.where for n in na} == {f"{SMI / 'smi_na.csv'}:{k}" for k in (3, 4, 5)}
    # clocks_throttle_reasons (older drivers) fills the same column
    assert t.column("clocks_event_reasons").null_count == 0


def test_iso_z_and_epoch_seconds_agree() -> None:
    a = read_samples(SMI / "smi_iso_z.csv").table
    b = read_samples(SMI / "smi_epoch_s.csv")
    assert a.column("ts").to_pylist() == b.table.column("ts").to_pylist()
    assert "epoch timestamps read as s" in _reasons(b.notes)


def test_a_header_with_quoted_names_reads_as_plain(tmp_path: Path) -> None:
    """RFC 4180 lets a header quote its names, and R's write.csv, Excel and pyarrow do:
    the names are the unquoted ones (before, '"ts"' was an unknown column)."""
    plain = read_samples(SMI / "smi_iso_z.csv").table
    lines = (SMI / "smi_iso_z.csv").read_text().splitlines(keepends=True)
    names = next(csv.reader([lines[0]]))
    quoted = tmp_path / "smi_iso_z.csv"  # the host is named after the file
    quoted.write_text(",".join(f'"{n.strip()}"' for n in names) + "\n" + "".join(lines[1:]))
    got = read_samples(quoted).table
    assert got.column_names == plain.column_names
    assert got.to_pylist() == plain.to_pylist()


def test_local_time_with_zone(tmp_path: Path) -> None:
    p = tmp_path / "paris.csv"
    p.write_text("timestamp, index, utilization.gpu [%]\n2025/10/15 15:57:04.086, 0, 5 %\n")
    rec = read_samples(p, tz="Europe/Paris")
    assert rec.table.column("ts")[0].as_py() == dt.datetime(2025, 10, 15, 13, 57, 4, 86000,
                                                            tzinfo=dt.timezone.utc)
    assert "assumed Europe/Paris" in _reasons(rec.notes)


def test_interleaved_uuid_and_extra_known_fields(tmp_path: Path) -> None:
    p = tmp_path / "uuid.csv"
    lines = ["timestamp, uuid, pci.bus_id, fan.speed [%], pstate, utilization.gpu [%]"]
    for k in range(3):
        for g in range(2):
            lines.append(f"2025/10/15 15:57:0{k}.000, GPU-{g}aa, 00000000:0{g}:00.0, 30 %, P0, "
                         f"{10 * k + g} %")
    p.write_text("\n".join(lines) + "\n")
    rec = read_samples(p)
    t = rec.table
    assert t.column("gpu_uuid").to_pylist()[:2] == ["GPU-0aa", "GPU-1aa"]
    assert t.column("labels")[1].as_py() == [("pci_bus_id", "00000000:01:00.0")]
    assert "fan.speed" in _reasons(rec.notes) and "pstate" in _reasons(rec.notes)
    assert rec.interval_s == 1.0


def test_appended_log_repeated_header_and_blank_line(tmp_path: Path) -> None:
    text = (SMI / "smi_units.csv").read_text().splitlines()
    head, body = text[0], text[1:]
    p = tmp_path / "appended.csv"
    p.write_text("\n".join([head, *body[:8], "", head, *body[8:]]) + "\n")
    rec = read_samples(p)
    assert rec.table.num_rows == 24
    reasons = _reasons(rec.notes)
    assert "repeated header" in reasons and "blank line" in reasons


def test_mapping_parse_and_mapped_csv() -> None:
    m = parse_mapping(" ts_ms=ts , gpu_util=util_gpu_pct,pod_name=pod,team=label:team,"
                      "watts=power_w")
    assert m == {"ts_ms": "ts", "gpu_util": "util_gpu_pct", "pod_name": "pod",
                 "team": "label:team", "watts": "power_w"}
    rec = read_samples(DATA / "files" / "mapped_ratio.csv", mapping=m)
    t = rec.table
    rows = list(csv.DictReader((DATA / "files" / "mapped_ratio.csv").open()))
    np.testing.assert_allclose(t.column("util_gpu_pct").to_numpy(),
                               [100 * float(r["gpu_util"]) for r in rows], rtol=1e-6)
    assert t.column("gpu_uuid").to_pylist()[:2] == ["mapped_ratio/trainer-0",
                                                   "mapped_ratio/trainer-1"]
    assert t.column("labels")[1].as_py() == [("team", "team-b")]
    assert t.column("ts")[0].as_py() == dt.datetime.fromtimestamp(
        int(rows[0]["ts_ms"]) / 1000, dt.timezone.utc)
    reasons = _reasons(rec.notes)
    assert "run" in reasons and "ratio" in reasons and "ms" in reasons and "per pod" in reasons


def test_mapping_explicit_scale_and_epoch_unit(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_text("t,u,sm\n1758685303487000,0.5,50\n1758685304487000,1.0,25\n")
    rec = read_samples(p, mapping={"t": "ts:us", "u": "util_gpu_pct:ratio",
                                   "sm": "sm_active:percent"})
    assert rec.table.column("util_gpu_pct").to_pylist() == [50.0, 100.0]
    assert rec.table.column("sm_active").to_pylist() == [0.5, 0.25]
    assert rec.table.column("ts")[0].as_py() == dt.datetime(2025, 9, 24, 3, 41, 43, 487000,
                                                            tzinfo=dt.timezone.utc)
    assert "ratio" not in _reasons(rec.notes)  # explicit: no auto-detection note


def test_jsonl_table_columns() -> None:
    rec = read_samples(DATA / "files" / "table.jsonl", gpu_model="NVIDIA H100 80GB HBM3")
    t = rec.table
    rows = [json.loads(x) for x in (DATA / "files" / "table.jsonl").read_text().splitlines()]
    assert t.column("gpu_uuid").to_pylist() == [r["gpu_uuid"] for r in rows]
    np.testing.assert_array_equal(t.column("power_w").to_numpy(),
                                  np.array([r["power_w"] for r in rows], np.float32))
    assert dict(t.column("labels")[0].as_py()) == {"team": "llm", "job": "nanogpt"}
    assert rec.source == "jsonl"


def test_foreign_parquet_in_table_columns(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    tbl = pa.table({
        "ts": pa.array([0, 10**6, 2 * 10**6], pa.timestamp("us")),
        "gpu_uuid": ["GPU-x", "GPU-x", "GPU-x"],
        "util_gpu_pct": [1.0, 50.0, float("nan")],
    })
    p = tmp_path / "foreign.parquet"
    pq.write_table(tbl, p)
    rec = read_samples(p, host="h1")
    assert rec.source == "parquet"
    assert rec.table.column("util_gpu_pct").to_pylist() == [1.0, 50.0, None]
    assert rec.interval_s == 1.0
    reasons = _reasons(rec.notes)
    assert "NaN" in reasons and "assumed UTC" in reasons


def test_hex_mask_full_width(tmp_path: Path) -> None:
    p = tmp_path / "hex.csv"
    p.write_text("timestamp,index,clocks_event_reasons.active\n"
                 "2025-01-01T00:00:00Z,0,0x8000000000000001\n"
                 "2025-01-01T00:00:01Z,0,0x00000000000000A0\n"
                 "2025-01-01T00:00:02Z,0,[N/A]\n")
    t = read_samples(p).table
    assert t.column("clocks_event_reasons").to_pylist() == [0x8000000000000001, 0xA0, None]


def test_unknown_format_rejected() -> None:
    with pytest.raises(InputError) as e:
        open_samples(NANOGPT, fmt="xlsx")
    assert "parquet, csv, jsonl, nvidia-smi" in str(e.value)


def test_compressed_csv_and_jsonl(tmp_path: Path) -> None:
    import gzip

    for name in ("nvidia_smi/smi_units.csv", "files/table.jsonl"):
        src = DATA / name
        gz = tmp_path / (src.name + ".gz")
        gz.write_bytes(gzip.compress(src.read_bytes()))
        a = read_samples(src, host="h").table
        b = read_samples(gz, host="h").table
        assert a.equals(b), name


# -- scale: declared units obeyed, auto-detection by the column's range (issue 14 item 4) --
DUTY = "ts,gpu,duty\n" + "".join(
    f"{1758685303 + i},{g},{v}\n" for i, row in enumerate(
        [(0.47, 28.2), (0.9, 31.5), (0.0, 12.25), (1.0, 0.33)]) for g, v in enumerate(row))


def _duty(tmp_path: Path, text: str = DUTY) -> Path:
    p = tmp_path / "cluster.csv"
    p.write_text(text)
    return p


def _util(rec: object) -> list[float]:
    return [round(v, 6) for v in rec.table.column("util_gpu_pct").to_pylist()]  # type: ignore[attr-defined]


def test_averaged_percent_readings_are_read_not_refused(tmp_path: Path) -> None:
    # 0.47 beside 28.2 in one column: percent by range (largest value above 1), said in a note
    p = _duty(tmp_path)
    rec = read_samples(p, mapping={"ts": "ts:s", "gpu": "gpu_index", "duty": "util_gpu_pct"})
    assert sorted(_util(rec)) == pytest.approx(
        sorted([0.47, 28.2, 0.9, 31.5, 0.0, 12.25, 1.0, 0.33]), rel=1e-6)
    note = next(n for n in rec.notes if n.column == "duty")
    assert "read as a percent (0..100)" in note.reason and "31.5" in note.reason
    assert "util_gpu_pct:ratio to override" in note.reason and note.where == f"{p}:2"


def test_a_declared_unit_is_obeyed(tmp_path: Path) -> None:
    p = _duty(tmp_path)
    rec = read_samples(p, mapping={"ts": "ts:s", "gpu": "gpu_index",
                                   "duty": "util_gpu_pct:percent"})
    assert sorted(_util(rec)) == pytest.approx(
        sorted([0.47, 28.2, 0.9, 31.5, 0.0, 12.25, 1.0, 0.33]), rel=1e-6)
    assert not [n for n in rec.notes if n.column == "duty"]  # nothing was guessed
    # percent declared on values that all lie within 0..1: still percent, not multiplied
    small = "ts,duty\n1758685303,0.47\n1758685304,0.9\n1758685305,0.25\n"
    rec = read_samples(_duty(tmp_path, small), mapping={"ts": "ts:s",
                                                        "duty": "util_gpu_pct:percent"})
    assert _util(rec) == pytest.approx([0.47, 0.9, 0.25], rel=1e-6)
    # and ratio declared on a column reaching 28.2 is a located error, not a silent x100
    with pytest.raises(SampleTableError, match="above 100"):
        read_samples(_duty(tmp_path), mapping={"ts": "ts:s", "gpu": "gpu_index",
                                               "duty": "util_gpu_pct:ratio"})


def test_auto_detection_judges_the_range_not_whole_numbers(tmp_path: Path) -> None:
    # all within 0..1 -> a ratio, whole numbers or not (1.0 and 0.0 decide nothing)
    text = "ts,duty\n1758685303,0.47\n1758685304,1.0\n1758685305,0\n1758685306,0.5\n"
    rec = read_samples(_duty(tmp_path, text), mapping={"ts": "ts:s", "duty": "util_gpu_pct"})
    assert _util(rec) == [47.0, 100.0, 0.0, 50.0]
    note = next(n for n in rec.notes if n.column == "duty")
    assert "read as a ratio (0..1)" in note.reason and "largest value in the first rows is 1" \
        in note.reason
    # whole numbers above 1 -> percent, as before
    text = "ts,duty\n1758685303,3\n1758685304,97\n"
    rec = read_samples(_duty(tmp_path, text), mapping={"ts": "ts:s", "duty": "util_gpu_pct"})
    assert _util(rec) == [3.0, 97.0]


def test_a_decision_contradicted_later_in_the_file_is_a_located_error(tmp_path: Path) -> None:
    # the first read block (4 KiB: a few hundred rows) holds ratios only; row 700 says 28.2
    rows = [0.25 + (i % 50) / 100 for i in range(800)]
    rows[698] = 28.2
    text = "ts,duty\n" + "".join(f"{1758685303 + i},{v}\n" for i, v in enumerate(rows))
    p = _duty(tmp_path, text)
    with pytest.raises(InputError) as e:
        read_samples(p, mapping={"ts": "ts:s", "duty": "util_gpu_pct"}, batch_rows=2)
    assert e.value.where == f"{p}:700" and "28.2" in str(e.value)
    assert "duty=util_gpu_pct:percent" in (e.value.fix or "")


def test_the_scale_decision_is_in_the_reports_data_notes(tmp_path: Path) -> None:
    import json

    from gpuaudit.cli import main

    p = _duty(tmp_path)
    out = tmp_path / "r.json"
    rc = main(["report", str(p), "--map", "ts=ts:s,gpu=gpu_index,duty=util_gpu_pct",
               "--price", "2", "--format", "json", "-o", str(out)])
    assert rc == 0
    notes = json.loads(out.read_text())["source"]["notes"]
    assert any("read as a percent (0..100)" in n["reason"] and n["column"] == "duty"
               for n in notes)
    md = tmp_path / "r.md"
    assert main(["report", str(p), "--map", "ts=ts:s,gpu=gpu_index,duty=util_gpu_pct",
                 "--price", "2", "--format", "markdown", "-o", str(md)]) == 0
    assert "read as a percent (0..100)" in md.read_text()
