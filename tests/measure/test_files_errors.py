"""Bad input: every importer raises a located, actionable error, never a silent zero or drop."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuaudit.errors import InputError, SampleTableError
from gpuaudit.measure.files import parse_mapping, read_samples

SMI = Path(__file__).parents[1] / "data" / "nvidia_smi"
UNITS = SMI / "smi_units.csv"


def _variant(tmp_path: Path, name: str, edit_line: int, old: str, new: str) -> Path:
    """smi_units.csv with one cell of one (1-based) line replaced."""
    lines = UNITS.read_text().splitlines()
    assert old in lines[edit_line - 1]
    lines[edit_line - 1] = lines[edit_line - 1].replace(old, new, 1)
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _err(path: Path, **kw: object) -> InputError:
    with pytest.raises(InputError) as e:
        read_samples(path, **kw)
    err = e.value
    assert err.fix, "every error names a fix"
    return err


def test_zero_bytes(tmp_path: Path) -> None:
    p = tmp_path / "empty.csv"
    p.write_bytes(b"")
    err = _err(p)
    assert err.where == str(p) and "0 bytes" in str(err)


def test_header_only(tmp_path: Path) -> None:
    p = tmp_path / "hdr.csv"
    p.write_text(UNITS.read_text().splitlines()[0] + "\n")
    err = _err(p)
    assert "no samples" in str(err) and str(p) in str(err)


def test_noheader_needs_fields() -> None:
    err = _err(SMI / "smi_noheader.csv")
    assert err.where == f"{SMI / 'smi_noheader.csv'}:1"
    assert "--fields" in (err.fix or "")


def test_fields_count_mismatch() -> None:
    err = _err(SMI / "smi_noheader.csv", fields=["timestamp", "index"])
    assert err.where is not None and err.where.endswith(":1") and "2 columns" in str(err)


def test_malformed_number(tmp_path: Path) -> None:
    p = _variant(tmp_path, "bad.csv", 6, "73.", "7x3.")
    err = _err(p)
    assert err.where == f"{p}:6"
    assert "power.draw" in str(err) and "7x3." in str(err)


def test_wrong_unit_in_value(tmp_path: Path) -> None:
    p = _variant(tmp_path, "gib.csv", 4, "81559 MiB", "79 GiB")
    err = _err(p)
    assert err.where == f"{p}:4" and "79 GiB" in str(err) and "MiB" in (err.fix or "")


def test_wrong_unit_in_header(tmp_path: Path) -> None:
    p = _variant(tmp_path, "hgib.csv", 1, "memory.used [MiB]", "memory.used [GiB]")
    err = _err(p)
    assert err.where is not None and err.where.startswith(f"{p}:1")
    assert "GiB" in str(err) and "MiB" in (err.fix or "")


def test_unknown_column_without_mapping(tmp_path: Path) -> None:
    p = _variant(tmp_path, "unk.csv", 1, "name", "mystery")
    err = _err(p)
    assert "mystery" in str(err) and err.where == f"{p}:1"
    assert "--map" in (err.fix or "")


def test_unknown_mapping_target_lists_valid_ones() -> None:
    with pytest.raises(InputError) as e:
        parse_mapping("gpu_util=utilisation")
    assert "util_gpu_pct" in (e.value.fix or "") and "label:<key>" in (e.value.fix or "")
    with pytest.raises(InputError):
        parse_mapping("gpu_util")


def test_mapping_names_missing_column() -> None:
    err = _err(UNITS, mapping={"nope": "pod"})
    assert "nope" in str(err)


def test_short_row(tmp_path: Path) -> None:
    lines = UNITS.read_text().splitlines()
    lines[9] = ", ".join(lines[9].split(", ")[:4])
    p = tmp_path / "short.csv"
    p.write_text("\n".join(lines) + "\n")
    err = _err(p)
    assert err.where == f"{p}:10" and "columns" in str(err)


def test_non_utf8(tmp_path: Path) -> None:
    data = UNITS.read_bytes().splitlines(keepends=True)
    data[7] = data[7].replace(b"NVIDIA", b"NVIDIA\xe9")
    p = tmp_path / "latin1.csv"
    p.write_bytes(b"".join(data))
    err = _err(p)
    assert err.where == f"{p}:8" and "UTF-8" in str(err)


def test_bad_timestamp(tmp_path: Path) -> None:
    p = _variant(tmp_path, "ts.csv", 12, "2025/09/24 03:41:4", "2025/13/24 03:41:4")
    err = _err(p)
    assert err.where == f"{p}:12" and "2025/13/24" in str(err)


def test_bad_timestamp_quotes_the_files_own_first_value(tmp_path: Path) -> None:
    # the message compares the bad value with the column's real first value and says where
    # that value is; it never quotes a made-up example as if it came from the file
    p = _variant(tmp_path, "ts.csv", 12, "2025/09/24 03:41:4", "yesterday at noon")
    err = _err(p)
    text = str(err)
    assert err.where == f"{p}:12" and "'yesterday at noon" in text
    assert f"'2025/09/24 03:41:43.487' ({p}:2)" in text
    assert "2025/10/15" not in text
    lines = [ln.replace("2025/09/24 ", "2025-09-24T").replace(".487,", ".487Z,", 1)
             if ln.startswith("2025") else ln for ln in UNITS.read_text().splitlines()]
    lines[5] = lines[5].replace("2025-09-24T03:41:4", "2025-09-24Q03:41:4", 1)
    z = tmp_path / "z.csv"
    z.write_text("\n".join(lines) + "\n")
    text = str(_err(z))
    assert f"'{lines[1].split(',')[0]}' ({z}:2)" in text and "2025-09-24Q03" in text
    assert "03:41:43Z" not in text


def test_time_runs_backwards(tmp_path: Path) -> None:
    lines = UNITS.read_text().splitlines()
    lines[1], lines[9] = lines[9], lines[1]  # GPU 0: second sample before the first
    p = tmp_path / "order.csv"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(SampleTableError) as e:
        read_samples(p)
    assert e.value.where == f"{p}:10" and e.value.column == "ts"


def test_order_checked_across_batches(tmp_path: Path) -> None:
    lines = UNITS.read_text().splitlines()
    p = tmp_path / "order2.csv"
    p.write_text("\n".join([lines[0], *lines[1:17], *lines[9:11]]) + "\n")
    with pytest.raises(SampleTableError) as e:
        read_samples(p, batch_rows=4)
    assert e.value.where == f"{p}:18"


def test_out_of_range_value(tmp_path: Path) -> None:
    p = _variant(tmp_path, "range.csv", 5, " 0 %", " 140 %")
    with pytest.raises(SampleTableError) as e:
        read_samples(p)
    assert e.value.where == f"{p}:5" and e.value.column == "util_gpu_pct"


def test_negative_power(tmp_path: Path) -> None:
    p = _variant(tmp_path, "neg.csv", 3, "81.42 W", "-81.42 W")
    with pytest.raises(SampleTableError) as e:
        read_samples(p)
    assert e.value.where == f"{p}:3" and e.value.column == "power_w"


def test_bad_jsonl_line(tmp_path: Path) -> None:
    src = (Path(__file__).parents[1] / "data" / "files" / "table.jsonl").read_text()
    lines = src.splitlines()
    lines[4] = lines[4][:-5]
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    err = _err(p)
    assert err.where == f"{p}:5"


def test_not_parquet(tmp_path: Path) -> None:
    p = tmp_path / "x.parquet"
    p.write_text("hello\n")
    err = _err(p)
    assert err.where == str(p) and "Parquet" in str(err)


def test_empty_index_cannot_identify(tmp_path: Path) -> None:
    p = _variant(tmp_path, "idx.csv", 7, ", 5, ", ", [N/A], ")
    err = _err(p)
    assert err.where == f"{p}:7" and "index" in str(err)


def test_a_saved_dcgm_exporter_page_is_read_by_report(tmp_path):
    """`curl node:9400/metrics > node.prom; gpuaudit report node.prom` (issue 26): one sample
    per GPU (a MIG instance too), not "unknown column '# HELP ...'"."""
    import json
    import shutil

    from gpuaudit.cli import main

    data = Path(__file__).parents[1] / "data" / "dcgm"
    for name, gpus in (("l4_kops_conformance.prom", 1), ("a100_mig_1g5gb_nvidia_docs.prom", 2)):
        page = tmp_path / name.replace(".prom", ".txt")  # told by content, not by suffix
        shutil.copy(data / name, page)
        out = tmp_path / f"{name}.json"
        assert main(["report", str(page), "--price", "1", "--format", "json", "-o",
                     str(out)]) == 0
        doc = json.loads(out.read_text())
        assert len(doc["gpus"]) == gpus
        assert doc["phases"]["overall"]["observed_s"] == 30.0 * gpus
        assert "snapshot" in json.dumps(doc["source"])
