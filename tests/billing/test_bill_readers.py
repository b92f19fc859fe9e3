"""Bill readers on real DuckDB: FOCUS 1.0-1.2 (CSV, CSV.gz, Parquet), AWS CUR legacy and 2.0,
GCP export; GPU lines found from the catalog; errors that name file, column and row."""

from __future__ import annotations

import gzip
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuaudit.errors import InputError
from gpuaudit.price.billing import detect_format, open_bill
from gpuaudit.price.billing.gpu_lines import match_sku

DATA = Path(__file__).parent.parent / "data" / "billing"


def _sum(bill: object, where: str = "TRUE") -> Decimal:
    v = bill.con.execute(f"SELECT sum(billed_cost) FROM bill_lines WHERE {where}").fetchone()[0]  # type: ignore[attr-defined]
    return v or Decimal(0)


def test_real_focus_sample_reads_whole_and_exact() -> None:
    b = open_bill(DATA / "focus_1.0_sample.csv")
    assert b.dialect == "FOCUS 1.0"
    n, nulls, lo = b.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE charge_start IS NULL), min(charge_start) "
        "FROM bill_lines").fetchone()
    assert n == 1000 and nulls == 0  # dates without T/Z parsed, none lost
    assert lo.year == 2024
    # EffectiveCost 0 with BilledCost > 0 is kept as written, never replaced
    zero_eff = b.con.execute("SELECT count(*) FROM bill_lines WHERE effective_cost = 0 "
                             "AND billed_cost > 0").fetchone()[0]
    assert zero_eff == 610
    # Decimal end to end: the sum equals Python's Decimal sum of the raw text
    import csv
    with open(DATA / "focus_1.0_sample.csv", newline="") as f:
        exact = sum((Decimal(r["BilledCost"]) for r in csv.DictReader(f)
                     if r["BilledCost"] != "NULL"), Decimal(0))
    assert _sum(b) == exact
    assert isinstance(_sum(b), Decimal)


def test_real_focus_sample_has_no_gpu_lines() -> None:
    b = open_bill(DATA / "focus_1.0_sample.csv")
    texts = [r[0] for r in b.con.execute("SELECT DISTINCT sku_text FROM bill_lines").fetchall()]
    assert texts and not [t for t in texts if match_sku(t)]


def test_spec_example_reads_with_currency_note() -> None:
    b = open_bill(DATA / "focus_spec_commitment_flexibility_2_resources.csv")
    assert "no currency column: amounts assumed USD" in b.notes
    assert _sum(b) == Decimal("2.00")
    assert b.con.execute("SELECT sum(effective_cost) FROM bill_lines").fetchone()[0] == 2


@pytest.mark.parametrize("text,instance,gpus", [
    ("USE1-BoxUsage:p4d.24xlarge", "p4d.24xlarge", 8),
    ("USE1-SpotUsage:p5.48xlarge", "p5.48xlarge", 8),
    ("p5e.48xlarge", "p5e.48xlarge", 8),
    ("USE2-BoxUsage:g5.xlarge", "g5.xlarge", 1),
    ("g6.12xlarge", "g6.12xlarge", 4),
    ("ND96isr H100 v5", "Standard_ND96isr_H100_v5", 8),
    ("a2-highgpu-1g", "a2-highgpu-1g", 1),
    ("a3-highgpu-8g", "a3-highgpu-8g", 8),
    ("g2-standard-24", "g2-standard-24", 2),
    ("gpu_8x_h100_sxm", "gpu_8x_h100_sxm", 8),
])
def test_gpu_instances_found_in_the_catalog(text: str, instance: str, gpus: int) -> None:
    m = match_sku(text)
    assert m is not None and m.instance == instance and m.gpus_per_instance == gpus


@pytest.mark.parametrize("text", ["USE1-BoxUsage:m5.large", "t4g.micro", "p5", "VM_MEDIUM",
                                  "USE1-TimedStorage-ByteHrs", "Tax"])
def test_non_gpu_lines_are_not_guessed(text: str) -> None:
    assert match_sku(text) is None


def test_per_gpu_sku() -> None:
    m = match_sku("Nvidia Tesla A100 GPU running in Americas")
    assert m is not None and m.per_gpu and m.gpus_per_instance == 1


@pytest.mark.parametrize("key,dialect", [
    ("focus_csv", "FOCUS 1.0"), ("focus_gz", "FOCUS 1.0"), ("focus_parquet", "FOCUS 1.2"),
    ("cur_csv", "AWS CUR (legacy)"), ("cur2_parquet", "AWS CUR 2.0")])
def test_every_format_reads_the_same_usd_bill(files: dict[str, Path], sc: object, key: str,
                                              dialect: str) -> None:
    import billgen

    path = files[key]
    b = open_bill(path.parent if key.startswith("cur") else path)
    assert b.dialect == dialect
    total = sum((ln.billed for ln in sc.lines if ln.currency == "USD"), Decimal(0))  # type: ignore[attr-defined]
    assert _sum(b, "currency = 'USD'") == total
    gpu = b.con.execute("SELECT DISTINCT sku_text FROM bill_lines").fetchall()
    found = {match_sku(t[0]).instance for t in gpu if match_sku(t[0])}  # type: ignore[union-attr]
    assert {"p5.48xlarge", "p4d.24xlarge", "g5.12xlarge", "g6.xlarge"} <= found
    assert billgen.usd_gpu_billed(sc) > 0  # type: ignore[arg-type]


def test_cur_categories(files: dict[str, Path]) -> None:
    b = open_bill(files["cur_csv"])
    rows = dict(b.con.execute(
        "SELECT pricing_category, count(*) FROM bill_lines WHERE sku_text LIKE '%p4d%' "
        "GROUP BY ALL").fetchall())
    assert rows == {"Dynamic": 6}
    eff = b.con.execute("SELECT sum(effective_cost), sum(billed_cost) FROM bill_lines "
                        "WHERE sku_text LIKE '%g5.12xlarge%'").fetchone()
    assert eff[0] > 0 and eff[1] == 0  # DiscountedUsage: reservation/EffectiveCost
    cats = {r[0] for r in b.con.execute("SELECT DISTINCT charge_category FROM bill_lines")
            .fetchall()}
    assert cats == {"Usage", "Credit", "Purchase", "Tax"}


def test_format_forced_and_wrong(files: dict[str, Path]) -> None:
    assert open_bill(files["cur_csv"], fmt="cur").fmt == "cur"
    with pytest.raises(InputError, match="--format cur was given but the columns are those "
                       "of FOCUS"):
        open_bill(files["focus_csv"], fmt="cur")


def test_detect_format_by_columns() -> None:
    assert detect_format(["BilledCost", "ChargePeriodStart", "ServiceProviderName"]) == (
        "focus", "FOCUS 1.2")
    assert detect_format(["lineItem/UsageStartDate", "lineItem/UnblendedCost"])[0] == "cur"
    assert detect_format(["usage_start_time", "cost", "sku"]) == ("gcp", "GCP billing export")
    assert detect_format(["a", "b"]) is None


def _focus_text(files: dict[str, Path]) -> list[str]:
    return files["focus_csv"].read_text().splitlines()


def test_bad_amount_names_file_column_row(files: dict[str, Path], tmp_path: Path) -> None:
    lines = _focus_text(files)
    cols = lines[0].split(",")
    i = cols.index("BilledCost")
    row = lines[5].split(",")
    # rows with quoted commas would shift: pick a row with no quotes
    k = next(j for j in range(3, len(lines)) if '"' not in lines[j])
    row = lines[k].split(",")
    row[i] = "$12.50"
    lines[k] = ",".join(row)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as e:
        open_bill(bad)
    msg = str(e.value)
    assert f"{bad}, column BilledCost, row {k}" in msg and "'$12.50'" in msg


def test_bad_timestamp_in_parquet_names_row(tmp_path: Path) -> None:
    t = pa.table({"ChargePeriodStart": ["2026-10-01T00:00:00Z", "yesterday"],
                  "ChargePeriodEnd": ["2026-10-01T01:00:00Z", "2026-10-01T02:00:00Z"],
                  "BilledCost": ["1.00", "2.00"], "BillingCurrency": ["USD", "USD"]})
    p = tmp_path / "f.parquet"
    pq.write_table(t, p)
    with pytest.raises(InputError, match=r"column ChargePeriodStart, row 2"):
        open_bill(p)


def test_missing_required_column(tmp_path: Path) -> None:
    p = tmp_path / "f.csv"
    p.write_text("BilledCost,ChargePeriodStart,BillingCurrency\n1.0,2026-10-01T00:00:00Z,USD\n")
    with pytest.raises(InputError, match="required column 'ChargePeriodEnd' is missing"):
        open_bill(p)


def test_unknown_columns_and_missing_files(tmp_path: Path) -> None:
    p = tmp_path / "f.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="cannot tell the bill's format"):
        open_bill(p)
    with pytest.raises(InputError, match="bill file not found"):
        open_bill(tmp_path / "nope.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no bill files"):
        open_bill(tmp_path / "empty")


def test_gcp_export_parquet_structs(tmp_path: Path) -> None:
    t = pa.table({
        "usage_start_time": pa.array(["2026-10-05 00:00:00 UTC"]),
        "usage_end_time": pa.array(["2026-10-05 01:00:00 UTC"]),
        "service": pa.array([{"id": "6F81", "description": "Compute Engine"}]),
        "sku": pa.array([{"id": "x", "description": "Nvidia Tesla A100 GPU running in Americas"}]),
        "cost": pa.array([Decimal("2.933908")], pa.decimal128(38, 9)),
        "currency": ["USD"],
        "usage": pa.array([{"amount": 3600.0, "unit": "seconds"}]),
        "resource": pa.array([{"name": "gke-node-1", "global_name": "//compute/gke-node-1"}]),
        "cost_type": ["regular"],
    })
    p = tmp_path / "gcp.parquet"
    pq.write_table(t, p)
    b = open_bill(p)
    assert b.dialect == "GCP billing export"
    row = b.con.execute("SELECT billed_cost, quantity, unit, resource_name, sku_text, service "
                        "FROM bill_lines").fetchone()
    assert row[0] == Decimal("2.933908") and row[1] == 3600.0 and row[2] == "seconds"
    assert row[3] == "gke-node-1" and match_sku(row[4]) is not None and row[5] == "Compute Engine"


def test_folder_of_partitioned_parquet(files: dict[str, Path], tmp_path: Path) -> None:
    t = pq.read_table(files["focus_parquet"])
    for i, part in enumerate((t.slice(0, 10), t.slice(10))):
        d = tmp_path / "year=2026" / f"month=10-{i}"
        d.mkdir(parents=True)
        pq.write_table(part, d / "part-0.parquet")
    b = open_bill(tmp_path)
    assert len(b.files) == 2
    assert _sum(b) == _sum(open_bill(files["focus_parquet"]))


def test_gz_csv_is_read(files: dict[str, Path]) -> None:
    with gzip.open(files["focus_gz"], "rt") as f:
        assert f.readline().startswith("BillingPeriodStart")
    assert _sum(open_bill(files["focus_gz"])) == _sum(open_bill(files["focus_csv"]))


def test_wrong_typed_parquet_column(tmp_path: Path) -> None:
    t = pa.table({"ChargePeriodStart": ["2026-10-01T00:00:00Z"],
                  "ChargePeriodEnd": ["2026-10-01T01:00:00Z"],
                  "BilledCost": [True], "BillingCurrency": ["USD"]})
    p = tmp_path / "f.parquet"
    pq.write_table(t, p)
    with pytest.raises(InputError, match=r"column BilledCost, row 1: column BilledCost has "
                       "type BOOLEAN, not an amount"):
        open_bill(p)


def test_typed_amount_too_wide_is_still_checked(tmp_path: Path) -> None:
    """A typed Parquet amount is trusted only where every value fits DECIMAL(38,12): a
    DECIMAL(38,0) of 30 digits does not, and is named with its row (issue 27 skips the
    check only for types that cannot fail)."""
    from decimal import Decimal

    t = pa.table({"ChargePeriodStart": pa.array([0, 3600], pa.timestamp("s", "UTC")),
                  "ChargePeriodEnd": pa.array([3600, 7200], pa.timestamp("s", "UTC")),
                  "BilledCost": pa.array([Decimal(1), Decimal(10**30)], pa.decimal128(38, 0)),
                  "BillingCurrency": ["USD", "USD"]})
    p = tmp_path / "wide.parquet"
    pq.write_table(t, p)
    with pytest.raises(InputError, match=r"column BilledCost, row 2"):
        open_bill(p)
