"""The bill's join on a real distributed engine: Spark local mode (pyspark + Java), over
partitioned Parquet. Every allocation equals DuckDB's to the cent (the showback and the
report's bill section identical; the join's exact units identical), on the generated bill,
on lines of hundreds of millions of dollars, and on hypothesis' random bills.

One SparkSession for the module (2 local cores, 2 shuffle partitions, 1 GiB driver; no
adaptive execution or whole-stage code generation, which only cost time on inputs this small)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuaudit.api import bill
from gpuaudit.price.billing import open_bill
from gpuaudit.price.billing.allocate import allocate
from gpuaudit.price.billing.sql.engines import (
    run_duckdb,
    run_spark,
    session_conf,
    spark_session,
)

sys.path.insert(0, str(Path(__file__).parent))
from test_bill_join import T0, bills, write_case


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    s = spark_session("local[2]", shuffle_partitions=2, driver_memory="1g",
                      conf={"spark.sql.adaptive.enabled": "false",
                            "spark.sql.codegen.wholeStage": "false"})
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def _same(a: Any, b: Any) -> None:
    assert a.extra["bill"] == b.extra["bill"]
    assert a.showback.equals(b.showback)


def test_generated_bill_equals_duckdb(files: dict[str, Path], spark: Any) -> None:
    kw: dict[str, Any] = {"telemetry": files["telemetry"], "by": ["team", "project"]}
    d = bill(files["focus_csv"], **kw)
    s = bill(files["focus_csv"], engine="spark", spark=spark, **kw)
    _same(d, s)
    assert s.extra["bill"]["currencies"]["USD"]["reconciliation"]["every_period_exact"]
    # method usage on the amortized cost, from the CUR 2.0 Parquet
    kw = {"telemetry": files["telemetry"], "by": ["team"], "method": "usage",
          "cost": "effective"}
    _same(bill(files["cur2_parquet"], **kw),
          bill(files["cur2_parquet"], engine="spark", spark=spark, **kw))


def test_focus13_provider_split_and_commitments_equal_duckdb(tmp_path: Path,
                                                             spark: Any) -> None:
    """FOCUS 1.3 on Spark: the provider's split (the spec's AllocatedMethodDetails examples)
    and the spec's contract commitment purchase and usage give DuckDB's report exactly."""
    import billgen
    from test_bill_focus13 import _contract_bill, _l4_telemetry, _split_bill

    sc = billgen.scenario()
    p, _node = _split_bill(sc, tmp_path / "split.csv")
    tel = billgen.write_telemetry(sc, tmp_path / "t.parquet")
    d = bill(p, telemetry=tel, by=["team", "project"])
    assert d.extra["bill"]["provider_split"]["lines"] == 28
    _same(d, bill(p, telemetry=tel, by=["team", "project"], engine="spark", spark=spark))
    ca = _contract_bill(tmp_path / "ca.csv", purchase_effective="500000.00")
    for cost in ("billed", "effective"):
        _same(bill(ca, telemetry=_l4_telemetry(), cost=cost),
              bill(ca, telemetry=_l4_telemetry(), cost=cost, engine="spark", spark=spark))


def _inputs(files: dict[str, Path], tmp: Path, scale: Decimal) -> dict[str, Any]:
    """The join's five inputs as DuckDB made them (bill costs times ``scale``; quantities
    with twelve significant digits, so the billed GPU-ms round from exact products)."""
    out = tmp / "sql"
    r = bill(files["focus_csv"], telemetry=files["telemetry"], by=["team", "project"],
             sql_dir=out)
    assert r.extra["bill"]
    t = pq.read_table(out / "bill_lines.parquet")
    for c in ("billed_cost", "effective_cost", "list_cost"):
        i = t.schema.get_field_index(c)
        t = t.set_column(i, c, pa.array([None if v is None else v * scale
                                         for v in t.column(c).to_pylist()],
                                        pa.decimal128(38, 12)))
    i = t.schema.get_field_index("quantity")
    t = t.set_column(i, "quantity", pa.array([None if v is None else v * 0.987654321987
                                              for v in t.column("quantity").to_pylist()],
                                             pa.float64()))
    return {"bill_lines": t, **{n: pq.read_table(out / f"{n}.parquet")
                                for n in ("gpu_skus", "host_map", "usage_hours",
                                          "split_groups")}}


def test_hundred_million_dollar_lines_exact_over_partitioned_parquet(
        files: dict[str, Path], tmp_path: Path, spark: Any) -> None:
    """Lines of billions of dollars (far past the ~$9.2M a line where 1e-12 units overflow a
    BIGINT): the exact units agree row for row; Spark reads the bill from a Hive-partitioned
    Parquet folder and the usage from a table in its catalog."""
    import duckdb

    inp = _inputs(files, tmp_path, Decimal(100_000_000))
    big = inp["bill_lines"]
    assert max(v for v in big.column("billed_cost").to_pylist() if v is not None) \
        > Decimal(9_300_000)
    day = pa.array([str(v.as_py().date()) + f"-{v.as_py().hour:02d}"
                    for v in big.column("charge_start")])
    part = tmp_path / "bill_parts"
    pq.write_to_dataset(big.append_column("day_hour", day), part, partition_cols=["day_hour"])
    assert len(list(part.iterdir())) > 3
    inp_path = tmp_path / "usage.parquet"
    pq.write_table(inp["usage_hours"], inp_path)
    spark.read.parquet(str(inp_path)).createOrReplaceTempView("usage_hours_tbl")
    window = ("2026-10-05T00:00:00Z", "2026-10-05T06:00:00Z")
    got = run_spark(spark, {"bill_lines": part, "gpu_skus": inp["gpu_skus"],
                            "host_map": inp["host_map"], "usage_hours": "usage_hours_tbl",
                            "split_groups": inp["split_groups"]},
                    2, "allocation", "billed", window)
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    for n, t in inp.items():
        con.register(f"{n}_a", t)
        con.execute(f"CREATE TABLE {n} AS SELECT * FROM {n}_a")
    run_duckdb(con, 2, "allocation", "billed", window)
    order = ("currency, charge_start, charge_end, kind, reason, g_0, g_1, phase")
    want = con.execute(f"SELECT currency, charge_start, charge_end, kind, reason, g_0, g_1, "
                       f"phase, CAST(units AS VARCHAR), gpu_ms FROM alloc ORDER BY {order}"
                       ).fetchall()
    con.register("spark_alloc", got["alloc"])
    have = con.execute(f"SELECT currency, charge_start, charge_end, kind, reason, g_0, g_1, "
                       f"phase, CAST(CAST(units AS HUGEINT) AS VARCHAR), gpu_ms "
                       f"FROM spark_alloc ORDER BY {order}").fetchall()
    assert have == want and len(want) > 10
    assert max(abs(int(r[8])) for r in want) > 9_300_000 * 10**12  # past BIGINT units
    tot = con.execute("SELECT CAST(sum(units) AS VARCHAR) FROM period_totals").fetchall()
    con.register("spark_pt", got["period_totals"])
    assert con.execute("SELECT CAST(sum(CAST(units AS HUGEINT)) AS VARCHAR) FROM spark_pt"
                       ).fetchall() == tot


def test_missing_pyspark_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuaudit.errors import InputError

    monkeypatch.setitem(sys.modules, "pyspark.sql", None)
    with pytest.raises(InputError) as e:
        spark_session()
    assert "gpuaudit[spark]" in (e.value.fix or "")


@settings(max_examples=4, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=bills(), method=st.sampled_from(["allocation", "usage"]))
def test_random_bills_equal_duckdb(case: Any, method: str, tmp_path: Path,
                                   spark: Any) -> None:
    p, hours = write_case(case, tmp_path)
    window = (T0, T0 + timedelta(hours=4))
    d = allocate(open_bill(p), hours, ["team"], method=method, window=window)
    s = allocate(open_bill(p), hours, ["team"], method=method, window=window,
                 engine="spark", spark=spark)
    assert d.summary == s.summary
    assert d.showback.equals(s.showback)


def test_cli_engine_spark_same_json(files: dict[str, Path], tmp_path: Path, spark: Any,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``gpuaudit bill --engine spark`` (on the active session) writes the same bill section
    of the JSON report as DuckDB."""
    import json

    from gpuaudit.cli import main

    args = ["bill", str(files["focus_parquet"]), "--telemetry", str(files["telemetry"]),
            "--by", "team", "--format", "json", "-o"]
    assert main([*args, str(tmp_path / "d.json")]) == 0, capsys.readouterr().err
    assert main([*args, str(tmp_path / "s.json"), "--engine", "spark"]) == 0, \
        capsys.readouterr().err
    d, s = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ds")
    assert d["extra"]["bill"] == s["extra"]["bill"]
    assert d["extra"]["bill"]["currencies"]["USD"]["lines"]


def test_local_session_collects_large_results() -> None:
    # the join's results are collected to the driver: Spark's default cap of 1g
    # (spark.driver.maxResultSize) fails a ~100M-line bill's gpu_lines (docs/benchmarks.md)
    conf = session_conf(shuffle_partitions=8, driver_memory="6g")
    assert conf["spark.driver.maxResultSize"] == "0"
    assert conf["spark.sql.shuffle.partitions"] == "8"
    assert conf["spark.driver.memory"] == "6g"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    # the caller's settings win
    mine = session_conf(conf={"spark.driver.maxResultSize": "2g",
                              "spark.sql.files.maxPartitionBytes": "64m"})
    assert mine["spark.driver.maxResultSize"] == "2g"
    assert mine["spark.sql.files.maxPartitionBytes"] == "64m"


def test_fixture_session_has_the_settings(spark: Any) -> None:
    # spark_session applies session_conf to the session it builds
    assert spark.sparkContext.getConf().get("spark.driver.maxResultSize") == "0"
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"


def test_spark_flags_need_engine_spark(files: dict[str, Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from gpuaudit.cli import main

    base = ["bill", str(files["focus_parquet"]), "--telemetry", str(files["telemetry"])]
    assert main([*base, "--spark-master", "local[1]"]) == 2
    err = capsys.readouterr().err
    assert "--spark-master" in err and "fix: add --engine spark" in err
    assert main([*base, "--engine", "spark", "--spark-conf", "spark.driver.memory"]) == 2
    err = capsys.readouterr().err
    assert "cannot read --spark-conf 'spark.driver.memory'" in err and "KEY=VALUE" in err


def test_cli_spark_master_and_conf_reach_the_session(files: dict[str, Path],
                                                     tmp_path: Path) -> None:
    # a fresh process (no active session): the master URL and settings given on the command
    # line are the session's; an unknown master fails in Spark itself, so it was passed on
    code = ("import sys; from gpuaudit.cli import main; rc = main(sys.argv[1:]); "
            "from pyspark.sql import SparkSession; s = SparkSession.getActiveSession(); "
            "s is None or print('MASTER', s.sparkContext.master, "
            "s.conf.get('spark.sql.shuffle.partitions'), "
            "s.sparkContext.getConf().get('spark.driver.maxResultSize')); sys.exit(rc)")
    base = [sys.executable, "-c", code, "bill", str(files["focus_parquet"]), "--telemetry",
            str(files["telemetry"]), "--format", "json", "--engine", "spark"]
    out = subprocess.run([*base, "-o", str(tmp_path / "s.json"), "--spark-master", "local[1]",
                          "--spark-conf", "spark.sql.shuffle.partitions=3",
                          "--spark-conf", "spark.driver.memory=1g",
                          # a cluster whose default filesystem is HDFS (none listens there):
                          # the inputs gpuaudit stages are read as file:// paths, not from it
                          "--spark-conf", "spark.hadoop.fs.defaultFS=hdfs://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "MASTER local[1] 3 0" in out.stdout
    from gpuaudit.cli import main

    assert main([*base[3:], "--engine", "duckdb", "-o", str(tmp_path / "d.json")]) == 0
    want, got = (json.loads((tmp_path / f"{e}.json").read_text())["extra"]["bill"]
                 for e in ("d", "s"))
    assert got == want and want["currencies"]["USD"]["bill_lines"] > 0
    bad = subprocess.run([*base, "-o", str(tmp_path / "b.json"),
                          "--spark-master", "nosuch://host:1"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "error: cannot start a Spark session on master 'nosuch://host:1'" in bad.stderr
    assert "fix: check the master URL" in bad.stderr
