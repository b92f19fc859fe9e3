"""``gpuaudit bill`` as the issue shows it: terminal, csv, html (real Chromium), json,
budgets, the input/output ``--format`` names, and errors on stderr with exit 2."""

from __future__ import annotations

import csv
import json
import sys
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from gpuaudit.cli import main

sys.path.insert(0, str(Path(__file__).parent.parent / "report"))


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_terminal_by_team_project(files: dict[str, Path], capsys: pytest.CaptureFixture[str]
                                  ) -> None:
    rc, out, err = run(["bill", str(files["focus_parquet"]), "--telemetry",
                        str(files["telemetry"]), "--by", "team,project"], capsys)
    assert rc == 0, err
    assert "Cloud bill split by team, project" in out
    assert "vision/detector" in out and "$155.12" in out
    assert "each exact to the cent: yes" in out
    assert "Measured nodes with no bill line" in out


def test_cur_folder_forced_format_usage_method(files: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["bill", str(files["cur_csv"].parent), "--format", "cur", "--telemetry",
                        str(files["telemetry"]), "--by", "namespace", "--method", "usage"],
                       capsys)
    assert rc == 0, err
    assert "AWS CUR (legacy)" in out and "method: usage" in out


def test_csv_showback_adds_up(files: dict[str, Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    out_csv = tmp_path / "showback.csv"
    rc, _out, err = run(["bill", str(files["focus_csv"]), "--telemetry",
                         str(files["telemetry"]), "--format", "csv", "-o", str(out_csv)], capsys)
    assert rc == 0, err
    rows = list(csv.DictReader(out_csv.open()))
    usd = [r for r in rows if r["currency"] == "USD"]
    js = run(["bill", str(files["focus_csv"]), "--telemetry", str(files["telemetry"]),
              "--format", "json"], capsys)[1]
    d = json.loads(js)["extra"]["bill"]["currencies"]["USD"]
    assert sum(Decimal(r["amount"]) for r in usd) == Decimal(d["reconciliation"]["billed"])
    assert {r["currency"] for r in rows} == {"USD", "EUR"}
    assert "gpu_hours" in rows[0] and "phase" in rows[0]


def test_parquet_showback(files: dict[str, Path], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq
    p = tmp_path / "showback.parquet"
    rc, _o, err = run(["bill", str(files["focus_csv"]), "--telemetry", str(files["telemetry"]),
                       "--format", "parquet", "-o", str(p)], capsys)
    assert rc == 0, err
    t = pq.read_table(p)
    assert str(t.schema.field("amount").type) == "decimal128(18, 2)"


def test_budgets_alert(files: dict[str, Path], tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    b = tmp_path / "budgets.toml"
    b.write_text('[budgets]\nvision = "1000.00"\nnlp = "100000"\n')
    rc, out, err = run(["bill", str(files["focus_csv"]), "--telemetry", str(files["telemetry"]),
                        "--budgets", str(b)], capsys)
    assert rc == 0, err
    # vision spent 155.12 on 2026-10-05 (5 days in: 4 days of 0 then 155.12):
    # forecast 155.12 + 155.12/5 x 26 = 961.74 < 1000; nlp far below
    assert "Budgets for 2026-10" in out
    js = json.loads(run(["bill", str(files["focus_csv"]), "--telemetry",
                         str(files["telemetry"]), "--budgets", str(b), "--format", "json"],
                        capsys)[1])
    teams = {t["team"]: t for t in js["extra"]["bill"]["budgets"]["teams"]}
    assert teams["vision"]["month_to_date"] == "155.12"
    assert teams["vision"]["forecast"] == "961.74"
    assert teams["vision"]["status"] == "may exceed"  # the interval's top crosses 1000
    b.write_text('[budgets]\nvision = "900.00"\n')
    rc, out, _ = run(["bill", str(files["focus_csv"]), "--telemetry", str(files["telemetry"]),
                      "--budgets", str(b)], capsys)
    assert "ALERT: team vision: month-end forecast 961.74 USD" in out


@pytest.mark.parametrize("args,msg", [
    (["--format", "xml"], "unknown --format 'xml'"),
    (["--format", "gcp"], "--format gcp was given but the columns are those of FOCUS"),
    (["--format", "parquet"], "--format parquet needs -o FILE"),
])
def test_errors_exit_2(files: dict[str, Path], capsys: pytest.CaptureFixture[str],
                       args: list[str], msg: str) -> None:
    rc, _out, err = run(["bill", str(files["focus_csv"]), "--telemetry",
                         str(files["telemetry"]), *args], capsys)
    assert rc == 2 and err.startswith("error: ") and msg in err


def test_no_telemetry_is_an_error(files: dict[str, Path], capsys: pytest.CaptureFixture[str]
                                  ) -> None:
    rc, _o, err = run(["bill", str(files["focus_csv"])], capsys)
    assert rc == 2 and "--telemetry FILE or --prometheus URL" in err


@pytest.mark.slow
def test_html_stacked_bars_in_chromium(files: dict[str, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from test_html_chromium import Browser

    b = tmp_path / "budgets.toml"
    b.write_text('[budgets]\nvision = "900.00"\n')
    page = tmp_path / "bill.html"
    rc, _o, err = run(["bill", str(files["focus_csv"]), "--telemetry", str(files["telemetry"]),
                       "--budgets", str(b), "--format", "html", "-o", str(page)], capsys)
    assert rc == 0, err
    browser = Browser()
    try:
        for width in (1280, 390):
            browser.load(page.as_uri(), width)
            assert browser.problems() == []
            assert browser.evaluate("document.documentElement.scrollWidth") <= width
            segs = json.loads(browser.evaluate(
                "JSON.stringify(Array.from(document.querySelectorAll("
                "'#chart-bill-USD tr.bill-line')).map(function(tr){return {"
                "line: tr.querySelector('th').textContent, segs: Array.from("
                "tr.querySelectorAll('.seg')).map(function(s){var r=s.getBoundingClientRect();"
                "return [s.dataset.phase, r.width];})};}))"))
            by = {s["line"]: s["segs"] for s in segs}
            # nlp's bar has two phases, underutilized (77.56) and productive (37.35),
            # drawn in proportion
            nlp = dict(by["nlp"])
            assert set(nlp) == {"underutilized", "productive"}
            assert nlp["underutilized"] / nlp["productive"] == pytest.approx(77.56 / 37.35,
                                                                             rel=0.05)
            # vision's bar (the largest line) is the widest
            widths = {k: sum(w for _p, w in v) for k, v in by.items()}
            assert max(widths, key=lambda k: widths[k]) == "vision"
            img = np.asarray(browser.screenshot()).astype(np.int16)
            rect = json.loads(browser.evaluate(
                "JSON.stringify((function(){var r=document.getElementById('chart-bill-USD')"
                ".getBoundingClientRect();return {x:r.left+scrollX,y:r.top+scrollY,w:r.width,"
                "h:r.height};})())"))
            region = img[int(rect["y"]):int(rect["y"] + rect["h"]),
                         int(rect["x"]):int(rect["x"] + rect["w"])]
            ink = (np.abs(region - 255).sum(axis=2) > 60).mean()
            assert ink > 0.05
            assert "900.00" in browser.evaluate("document.getElementById('bill').textContent")
    finally:
        browser.close()
