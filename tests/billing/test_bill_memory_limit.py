"""The bill's DuckDB holds at most a memory limit: 80 % of the memory available by default
(DuckDB's own default, 80 % of the RAM installed, got a 100M-line join killed by the OOM
killer beside other work, docs/benchmarks.md), or ``--memory-limit`` / ``memory_limit=``;
past it DuckDB spills to disk, and the bill's figures do not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaudit.api import bill
from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.price.billing import readers
from gpuaudit.price.billing.readers import connect_duckdb, duckdb_memory_limit, open_bill


def _setting(con: object) -> str:
    return str(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])  # type: ignore[attr-defined]


def test_default_is_eighty_percent_of_available(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       32000000 kB\nMemFree:   100 kB\n"
                    "MemAvailable:   10000000 kB\nBuffers: 5 kB\n", encoding="ascii")
    assert duckdb_memory_limit(info) == 10_000_000 * 1024 * 8 // 10
    info.write_text("MemAvailable:   1000 kB\n", encoding="ascii")
    assert duckdb_memory_limit(info) == 1 << 30  # never below 1 GiB
    info.write_text("MemTotal:       32000000 kB\n", encoding="ascii")
    assert duckdb_memory_limit(info) is None  # the system does not say: DuckDB's default
    assert duckdb_memory_limit(tmp_path / "absent") is None
    info.write_text("MemAvailable:   lots kB\n", encoding="ascii")
    assert duckdb_memory_limit(info) is None


def test_the_connection_takes_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _setting(connect_duckdb("300MB")) == "286.1 MiB"
    assert _setting(connect_duckdb(1 << 30)) == "1.0 GiB"
    monkeypatch.setattr(readers, "duckdb_memory_limit", lambda: 512 << 20)
    assert _setting(connect_duckdb()) == "512.0 MiB"  # the default goes through
    monkeypatch.setattr(readers, "duckdb_memory_limit", lambda: None)
    assert _setting(connect_duckdb()) != "512.0 MiB"  # DuckDB's own default


@pytest.mark.parametrize("bad", ["lots", "-5GB", "1KB", 1000])
def test_a_bad_limit_is_a_clear_error(bad: str | int) -> None:
    with pytest.raises(InputError) as err:
        connect_duckdb(bad)
    assert err.value.fix


def test_open_bill_uses_it(files: dict[str, Path]) -> None:
    b = open_bill(files["focus_parquet"], memory_limit="200MB")
    assert _setting(b.con) == "190.7 MiB"


def test_a_small_limit_gives_the_same_bill(files: dict[str, Path]) -> None:
    kw = {"telemetry": files["telemetry"], "by": ("team",)}
    free = bill(files["focus_csv"], **kw).extra["bill"]  # type: ignore[arg-type]
    tight = bill(files["focus_csv"], memory_limit="16MB", **kw).extra["bill"]  # type: ignore[arg-type]
    assert json.dumps(tight, sort_keys=True, default=str) == \
        json.dumps(free, sort_keys=True, default=str)


def test_cli_flag(files: dict[str, Path], tmp_path: Path,
                  capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bill", str(files["focus_parquet"]), "--telemetry", str(files["telemetry"]),
            "--format", "json"]
    assert main([*args, "-o", str(tmp_path / "a.json")]) == 0
    assert main([*args, "--memory-limit", "64MiB", "-o", str(tmp_path / "b.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())["extra"]["bill"]
    b = json.loads((tmp_path / "b.json").read_text())["extra"]["bill"]
    assert a == b
    capsys.readouterr()
    assert main([*args, "--memory-limit", "lots"]) == 2
    err = capsys.readouterr().err
    assert "--memory-limit" in err and "fix:" in err
