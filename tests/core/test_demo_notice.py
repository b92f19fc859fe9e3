"""The demo says it is a demo (issue 14, item 6): with no GPU, ``gpuaudit audit`` audits the
bundled recording and says so in the terminal report, the JSON (top-level ``demo``) and the
HTML; the bundled recording's data notes carry nothing a user of the file cannot check."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from gpuaudit.api import audit
from gpuaudit.cli.audit import demo_path
from gpuaudit.measure.parquet_io import META_NOTES, read_metadata
from gpuaudit.schema import META_SOURCE

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "core" / "nanogpt_8xh100_nvidia_smi.csv"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuaudit.cli", "audit", *args],
                          capture_output=True, text=True, timeout=120)


def test_audit_without_gpu_says_demo_in_terminal_json_and_html(tmp_path: Path) -> None:
    term = _cli()
    assert term.returncode == 0, term.stderr
    assert "DEMO: this report is of the bundled real recording" in term.stdout
    assert "not of this machine's GPUs" in term.stdout
    out = _cli("--format", "json")
    d = json.loads(out.stdout)
    assert d["schema_version"] >= "1.1"
    assert d["demo"]["recording"] == "nanogpt_8xh100.parquet"
    assert d["demo"]["statement"].startswith("DEMO:") and d["demo"]["reason"]
    assert "demo" not in d["extra"]
    page = tmp_path / "r.html"
    assert _cli("--format", "html", "-o", str(page)).returncode == 0
    html = page.read_text()
    assert 'id="demo-notice"' in html and "not of this machine&#x27;s GPUs" in html


def test_a_report_of_user_data_is_not_marked_demo() -> None:
    d = audit(LOG, gpu_model="H100", host="h").to_dict()
    assert d["demo"] is None


def test_bundled_recording_notes_hold_no_build_time_details() -> None:
    meta = read_metadata(pq.ParquetFile(demo_path()))
    assert meta[META_SOURCE] == b"parquet"
    notes = json.loads(meta[META_NOTES])
    text = json.dumps(notes)
    for bad in ("--host", "../", "shared/", "/work/", "nvidia-smi-csv"):
        assert bad not in text, bad
    assert all(n["where"].startswith("gpu_metrics.csv:") for n in notes)
    rep = audit(demo_path())
    assert rep.usage.source == "parquet"
    for fmt in ("terminal", "markdown", "html", "json"):
        body = rep.render(fmt)
        assert "taken from --host" not in body and "../shared" not in body, fmt


def test_bundled_recording_is_what_the_script_builds() -> None:
    """scripts/make_demo_recording.py on the same public log gives the bundled rows and
    notes (so regenerating it keeps the provenance clean)."""
    spec = importlib.util.spec_from_file_location("make_demo", ROOT / "scripts" /
                                                  "make_demo_recording.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rec = mod.build(LOG)
    assert rec.source == "parquet"
    bundled = pq.read_table(demo_path())
    # the bundled file may predate columns added since (the CPU ones): those must be null
    assert rec.table.select(bundled.column_names).equals(bundled)
    for name in set(rec.table.column_names) - set(bundled.column_names):
        assert rec.table.column(name).null_count == rec.table.num_rows, name
    built = [(n.reason, n.count, n.where, n.column) for n in rec.notes]
    shipped = [(n["reason"], n["count"], n["where"], n["column"])
               for n in json.loads(read_metadata(pq.ParquetFile(demo_path()))[META_NOTES])]
    assert built == shipped
