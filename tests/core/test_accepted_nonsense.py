"""Nonsense that used to be accepted or end in a traceback (issue 26, part 6): each is a
clear error naming where and how to fix it, or, for a log across a daylight-saving change,
read correctly."""

from __future__ import annotations

import itertools
import json
import tempfile
from decimal import Decimal
from pathlib import Path

import pytest
from coretables import recording, series_table

from gpuaudit.api import audit, audit_fleet
from gpuaudit.capacity.rightsize import load_bench
from gpuaudit.cli import main
from gpuaudit.errors import InputError
from gpuaudit.measure.files import read_samples
from gpuaudit.measure.parquet_io import write_recording
from gpuaudit.price.catalog import load_user_catalog

DEMO = Path(__file__).parents[2] / "src" / "gpuaudit" / "data" / "nanogpt_8xh100.parquet"


@pytest.mark.parametrize(("value", "message"), [
    ('"nan"', "not a finite number"), ("inf", "not a finite number"),
    ('"-inf"', "not a finite number"), ('"1e9"', "above 1000 USD per GPU-hour"),
    ("2000", "above 1000 USD per GPU-hour"),
])
def test_user_catalog_refuses_non_finite_and_absurd_prices(tmp_path: Path, value: str,
                                                          message: str) -> None:
    p = tmp_path / "prices.toml"
    p.write_text(f'[[price]]\ngpu_model = "H100"\nprovider = "aws"\nusd_per_gpu_hour = {value}\n')
    with pytest.raises(InputError, match=message) as e:
        load_user_catalog(p)
    assert e.value.where is not None and "[[price]] #1" in e.value.where


def test_user_catalog_spot_price_is_held_to_the_same_range(tmp_path: Path) -> None:
    p = tmp_path / "prices.toml"
    p.write_text('[[price]]\ngpu_model = "H100"\nusd_per_gpu_hour = "2.5"\n'
                 'spot_usd_per_gpu_hour = "nan"\n')
    with pytest.raises(InputError, match="spot_usd_per_gpu_hour 'nan' is not a finite"):
        load_user_catalog(p)


@pytest.mark.parametrize("row", ["H100,nan,20", "H100,inf,", "H100,100,nan", "H100,100,-3"])
def test_bench_table_refuses_nan_and_inf(tmp_path: Path, row: str) -> None:
    p = tmp_path / "bench.csv"
    p.write_text(f"gpu_model,throughput_per_s,p99_ms\n{row}\n")
    with pytest.raises(InputError) as e:
        load_bench(p)
    assert e.value.where == f"{p}:2"


def test_fleet_recording_honours_start_and_end(tmp_path: Path) -> None:
    util = {"g0": [95.0] * 60 + [0.0] * 60, "g1": [50.0] * 120}
    table = series_table(util, interval_s=60.0, t0_s=1_700_000_000)
    path = tmp_path / "fleet.parquet"
    write_recording(recording(table, interval_s=60.0), path)
    whole = audit_fleet(recording=path, pricing={"price": "1"})
    first_hour = audit_fleet(recording=path, start_s=1_700_000_000,
                             end_s=1_700_000_000 + 3600, pricing={"price": "1"})
    assert first_hour.usage.series[0].observed_s == pytest.approx(3600.0)
    assert whole.usage.series[0].observed_s == pytest.approx(7200.0)
    g0 = {s.gpu_uuid: s for s in first_hour.usage.series}["g0"]
    assert g0.mean_util_pct == pytest.approx(95.0)  # the idle second hour is outside
    with pytest.raises(InputError, match="no samples in the range given by --start/--end"):
        audit_fleet(recording=path, start_s=1_600_000_000, end_s=1_600_003_600,
                    pricing={"price": "1"})


LOG_HEAD = "timestamp, index, utilization.gpu [%], power.draw [W]\n"


def _fall_back_log(tmp_path: Path) -> Path:
    # America/New_York, 2025-11-02: at 02:00 EDT the clock goes back to 01:00 EST, so
    # 01:00-01:59 happens twice; one sample a minute from 01:30 EDT to 01:29 EST
    rows = [f"2025/11/02 01:{m:02d}:00.000, 0, 50 %, 100.00 W" for m in range(30, 60)]
    rows += [f"2025/11/02 01:{m:02d}:00.000, 0, 50 %, 100.00 W" for m in range(0, 30)]
    path = tmp_path / "fall.csv"
    path.write_text(LOG_HEAD + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("batch_rows", [7, 1 << 20])
def test_nvidia_smi_log_across_a_fall_back_is_read_in_order(tmp_path: Path,
                                                            batch_rows: int) -> None:
    from gpuaudit.measure.files import open_samples

    rec = open_samples(_fall_back_log(tmp_path), tz="America/New_York",
                       batch_rows=batch_rows).to_recording()
    ts = [t.value for t in rec.table.column("ts")]
    assert all(b - a == 60 * 10**9 for a, b in itertools.pairwise(ts))  # one minute apart, always
    report = audit(rec, price=Decimal("1"))
    assert report.usage.series[0].observed_s == pytest.approx(3600.0)


def test_fall_back_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["report", str(_fall_back_log(tmp_path)), "--tz", "America/New_York",
                 "--price", "1", "--format", "json", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["phases"]["overall"]["observed_s"] == 3600.0


def test_nonexistent_local_time_stays_an_error(tmp_path: Path) -> None:
    # 2025-03-09 02:30 does not exist in New York: no running clock wrote it
    path = tmp_path / "spring.csv"
    path.write_text(LOG_HEAD + "2025/03/09 01:59:00.000, 0, 50 %, 100.00 W\n"
                    "2025/03/09 02:30:00.000, 0, 50 %, 100.00 W\n")
    with pytest.raises(InputError) as e:
        read_samples(path, tz="America/New_York")
    assert e.value.where == f"{path}:3"


def test_demo_recording_unchanged_by_the_dst_path() -> None:
    with tempfile.TemporaryDirectory():
        assert read_samples(DEMO).table.num_rows > 0
