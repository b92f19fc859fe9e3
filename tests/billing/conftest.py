"""Fixtures for the billing tests: the generated scenario written in each format."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import billgen

DATA = Path(__file__).parent.parent / "data" / "billing"


@pytest.fixture(scope="session")
def sc() -> billgen.Scenario:
    return billgen.scenario()


@pytest.fixture(scope="session")
def files(sc: billgen.Scenario, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bill")
    return {
        "focus_csv": billgen.write_csv(billgen.focus_rows(sc, "plain"), d / "focus.csv",
                                       billgen.FOCUS_COLUMNS),
        "focus_gz": billgen.write_csv(billgen.focus_rows(sc), d / "focus.csv.gz",
                                      billgen.FOCUS_COLUMNS),
        "focus_parquet": billgen.write_focus_parquet(sc, d / "focus.parquet"),
        "cur_csv": billgen.write_csv(billgen.cur_rows(sc), d / "cur" / "cur-00001.csv.gz",
                                     billgen.CUR_COLUMNS),
        "cur2_parquet": billgen.write_cur2_parquet(sc, d / "cur2" / "part-0.parquet"),
        "telemetry": billgen.write_telemetry(sc, d / "run.parquet"),
    }
