"""The README's commands, run as a user runs them (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "core"


def gpuaudit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuaudit.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_audit_without_gpu_says_it_uses_the_bundled_real_recording():
    p = gpuaudit("audit", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert "bundled REAL recording" in p.stderr
    d = json.loads(p.stdout)
    assert d["source"]["origin"].startswith("real recording")


def test_report_nvidia_smi_log_with_price_to_json_file(tmp_path):
    out = tmp_path / "report.json"
    p = gpuaudit("report", str(DATA / "nanogpt_8xh100_nvidia_smi.csv"), "--price", "3.20",
                 "--format", "json", "-o", str(out))
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    assert d["rates"][0]["usd_per_gpu_hour"] == "3.20"
    assert d["cost"]["hourly_usd"] == "25.6000"


def test_report_mapped_pod_csv_by_pod(tmp_path):
    csv = tmp_path / "pods.csv"
    lines = ["time,pod_name,gpu_util"]
    for i in range(60):
        lines.append(f"{1_700_000_000 + i},train-a,{95 if i % 2 else 90}")
        lines.append(f"{1_700_000_000 + i},notebook-b,{0 if i < 50 else 20}")
    csv.write_text("\n".join(lines) + "\n")
    p = gpuaudit("report", str(csv), "--map", "gpu_util=util_gpu_pct,time=ts,pod_name=pod",
                 "--by", "pod", "--gpu-model", "A100", "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    rows = {r["key"]["pod"]: r for r in d["groups"]["rows"]}
    assert set(rows) == {"train-a", "notebook-b"}
    assert rows["notebook-b"]["phases"]["shares_pct"]["idle"] > 70


def test_unknown_gpu_model_error_lists_known_models():
    p = gpuaudit("report", str(DATA / "nanogpt_8xh100_nvidia_smi.csv"), "--gpu-model",
                 "Voodoo5")
    assert p.returncode == 2
    assert p.stderr.startswith("error: ") and "H100 80GB SXM" in p.stderr


def test_missing_model_without_price_is_a_clear_error():
    p = gpuaudit("report", str(DATA / "nanogpt_8xh100_nvidia_smi.csv"))
    assert p.returncode == 2 and "--gpu-model" in p.stderr


def test_by_a_label_no_sample_has_is_warned_not_silently_one_group(tmp_path, capsys):
    # issue 14 item 8: --by nosuchlabel gave one "(none)" group and no warning
    import json as _json

    from gpuaudit.cli import main as _main

    p = tmp_path / "pods.csv"
    p.write_text("ts,gpu,util,owner,proj\n" + "".join(
        f"{1758685303 + i},{g},{(i * 37 + g * 11) % 100},team-{g},p{g % 2}\n"
        for i in range(20) for g in range(2)))
    args = ["report", str(p), "--map", "ts=ts:s,gpu=gpu_index,util=util_gpu_pct,"
            "owner=label:team,proj=label:project", "--price", "2", "--format", "json"]
    out = tmp_path / "r.json"
    assert _main([*args, "--by", "nosuchlabel", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: --by nosuchlabel: no sample carries the label 'nosuchlabel'" in err
    assert "the labels present are: project, team" in err
    rep = _json.loads(out.read_text())
    notes = [n for n in rep["source"]["notes"] if n["where"] == "--by"]
    assert len(notes) == 1 and "'(none)' group" in notes[0]["reason"]
    assert "project, team" in notes[0]["reason"]
    # a key that exists: no warning, real groups
    assert _main([*args, "--by", "team", "-o", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    rep = _json.loads(out.read_text())
    assert not [n for n in rep["source"]["notes"] if n["where"] == "--by"]
    # a table column no sample has (pod) is warned about too, in markdown as well
    md = tmp_path / "r.md"
    assert _main([*args[:-2], "--by", "pod", "--format", "markdown", "-o", str(md)]) == 0
    assert "--by pod: no sample has a 'pod' value" in capsys.readouterr().err
    assert "--by pod: no sample has a 'pod' value" in md.read_text()
