"""The join's SQL text in every dialect: it parses in its own dialect (sqlglot), uses no
float or double and none of the engine-only syntax the issue found (GROUP BY ALL, temp
tables, HUGEINT/INT128 and ``//`` outside DuckDB, epoch/TIME_TO_UNIX), every row_number() is
ordered, and it equals the golden file (tests/data/billing/sql/<dialect>.sql).

Regenerate the golden files after a deliberate change to the SQL:

    GPUAUDIT_REGEN_GOLDEN=1 .venv/bin/pytest tests/billing/test_bill_sql_text.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from gpuaudit.cli import main
from gpuaudit.price.billing.sql import DIALECTS, inputs_ddl, script

GOLDEN = Path(__file__).parent.parent / "data" / "billing" / "sql"
WINDOW = ("2026-10-05T00:00:00Z", "2026-10-05T06:00:00Z")
FORBIDDEN = {
    "all": [r"GROUP\s+BY\s+ALL", r"\bTIME_TO_UNIX\b", r"\bepoch\s*\(", r"\bFLOAT\b",
            r"\bDOUBLE\b", r"\bREAL\b", r"\bFLOAT64\b", r"OVER\s*\(\s*\)", r"\bto_unixtime\b",
            r"\bany_value\b"],
    "portable": [r"\bTEMP(ORARY)?\s+TABLE\b", r"\bHUGEINT\b", r"\bINT128\b", r"//",
                 r"CREATE\s+OR\s+REPLACE"],
}


def golden_text(dialect: str) -> str:
    return (f"-- inputs ({dialect})\n" + inputs_ddl(2, dialect)
            + f"\n-- the join: method allocation, cost billed, window {WINDOW[0]} .. "
            f"{WINDOW[1]}\n" + script(2, "allocation", "billed", WINDOW, dialect))


def _code(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("method", ["allocation", "usage"])
def test_parses_in_its_dialect_with_no_float(dialect: str, method: str) -> None:
    text = inputs_ddl(2, dialect) + script(2, method, "effective", WINDOW, dialect)
    trees = [t for t in sqlglot.parse(text, read=dialect) if t is not None]
    assert len(trees) == 5 + 9  # 5 inputs, 9 derived relations
    for t in trees:
        for dt in t.find_all(exp.DataType):
            assert not dt.is_type(*exp.DataType.FLOAT_TYPES), (dialect, dt.sql(dialect))
        # every function is one sqlglot knows in this dialect (none engine-only)
        assert not list(t.find_all(exp.Anonymous)), (dialect, [
            a.sql(dialect) for a in t.find_all(exp.Anonymous)])
        for w in t.find_all(exp.Window):
            if isinstance(w.this, exp.RowNumber):
                assert w.args.get("order"), "row_number() must be ordered"
    code = _code(text)
    for pat in FORBIDDEN["all"] + (FORBIDDEN["portable"] if dialect != "duckdb" else []):
        assert not re.search(pat, code, re.IGNORECASE), (dialect, pat)
    # no float literal (3600.0) that would send the arithmetic through floating point
    assert not re.search(r"\d\.\d", re.sub(r"'[^']*'", "''", code)), dialect


def test_money_is_38_digit_decimal() -> None:
    for dialect, d in DIALECTS.items():
        ddl = inputs_ddl(0, dialect)
        assert re.search(rf"billed_cost {re.escape(d.money)}", ddl)
        assert d.money in ("DECIMAL(38,12)", "BIGNUMERIC")
        assert d.units in ("DECIMAL(38,0)", "BIGNUMERIC", "HUGEINT")


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_golden(dialect: str) -> None:
    p = GOLDEN / f"{dialect}.sql"
    text = golden_text(dialect)
    if os.environ.get("GPUAUDIT_REGEN_GOLDEN"):
        p.write_text(text, encoding="utf-8")
    assert p.read_text(encoding="utf-8") == text, (
        f"{p} differs; if the change is meant, regenerate: GPUAUDIT_REGEN_GOLDEN=1 "
        ".venv/bin/pytest tests/billing/test_bill_sql_text.py")


def test_golden_trino_has_what_the_issue_found_missing() -> None:
    """The golden Trino text itself (what a user reads) parses in Trino and uses no float."""
    text = (GOLDEN / "trino.sql").read_text(encoding="utf-8")
    assert all(t is not None for t in sqlglot.parse(text, read="trino"))
    assert not re.search(r"\b(DOUBLE|REAL|FLOAT)\b", _code(text), re.IGNORECASE)
    assert "date_diff('millisecond'" in text and "DECIMAL(38,0)" in text


@pytest.mark.parametrize("dialect", ["trino", "bigquery", "spark"])
def test_cli_sql_out_dialect(files: dict[str, Path], tmp_path: Path, dialect: str,
                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sql"
    rc = main(["bill", str(files["focus_csv"]), "--telemetry",
                                  str(files["telemetry"]), "--by", "team,project",
                                  "--format", "json", "-o", str(tmp_path / "r.json"),
                                  "--sql-out", str(out), "--dialect", dialect])
    assert rc == 0, capsys.readouterr().err
    names = {p.name for p in out.iterdir()}
    assert {"join.sql", "inputs.sql", "README.md", "bill_lines.parquet",
            "usage_hours.parquet"} <= names
    text = (out / "inputs.sql").read_text() + (out / "join.sql").read_text()
    assert len(sqlglot.parse(text, read=dialect)) == 5 + 9  # 5 inputs, 9 derived relations
    assert "usage_hours" in (out / "README.md").read_text()
    ddl = (out / "inputs.sql").read_text()
    assert "g_0" in ddl and "g_1" in ddl  # two group keys: team, project


def test_cli_dialect_without_sql_out_is_an_error(files: dict[str, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["bill", str(files["focus_csv"]), "--telemetry", str(files["telemetry"]),
               "--dialect", "trino"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--sql-out" in err and "fix:" in err
