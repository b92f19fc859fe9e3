"""Engine adapters: run the join (``join.py``) on DuckDB or on a Spark session and hand back
its three results as Arrow tables. Nothing outside this module knows which engine ran.

DuckDB materializes each derived relation as a temp table in the bill's connection. Spark
(``pip install 'gpuaudit[spark]'``) reads the five inputs from Parquet paths, catalog tables
or Arrow tables, registers each derived relation as a temp view, and collects the results
(small: periods x lines x phases, plus one row per GPU resource and charge period).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gpuaudit.errors import InputError
from gpuaudit.price.billing.sql.join import INPUTS, RESULTS, relations

__all__ = ["ENGINES", "STREAMED", "load_results", "run_duckdb", "run_join", "run_spark",
           "session_conf", "spark_session"]

ENGINES = ("duckdb", "spark")
#: derived relations DuckDB streams into the one relation that reads them (temp views)
#: rather than writing them out: ``weights`` (~950,000 rows for 1,000 GPUs x 30 days, read
#: by ``alloc`` alone; as a table its writing cost as much as ``alloc``'s grouping)
STREAMED = frozenset({"weights"})
# the results' integer-unit columns: HUGEINT when read back into DuckDB
_UNIT_COLUMNS = {"gpu_lines": ("cost_units",), "alloc": ("units",),
                 "period_totals": ("units",)}


def run_join(con: Any, engine: str, n_keys: int, method: str, cost: str,
             window: tuple[str, str] | None, *, spark: Any = None) -> None:
    """Run the join over the five inputs in DuckDB ``con`` on ``engine``; the results
    (``gpu_lines``, ``alloc``, ``period_totals``) are left in ``con`` as temp tables either way.

    ``spark``: the session for ``engine="spark"`` (else the active one, else local mode); the
    inputs go to it as Parquet (the bill partitioned by currency)."""
    if engine == "duckdb":
        run_duckdb(con, n_keys, method, cost, window)
        return
    if engine != "spark":
        raise InputError(f"unknown engine {engine!r}", fix="use duckdb or spark")
    session = spark if spark is not None else spark_session()
    with tempfile.TemporaryDirectory(prefix="gpuaudit-bill-") as tmp:
        inputs: dict[str, str | Path | pa.Table] = {}
        for rel in INPUTS:
            where = Path(tmp) / rel
            part = ", PARTITION_BY (currency)" if rel == "bill_lines" else ""
            quoted = str(where).replace("'", "''")
            con.execute(f"COPY (SELECT * FROM {rel}) TO '{quoted}' (FORMAT parquet{part})")
            inputs[rel] = where  # a Path: read as file://, whatever the cluster's default FS
        results = run_spark(session, inputs, n_keys, method, cost, window)
    load_results(con, results)


def run_duckdb(con: Any, n_keys: int, method: str, cost: str,
               window: tuple[str, str] | None) -> None:
    """Run the join in ``con`` over its ``bill_lines``, ``gpu_skus``, ``host_map`` and
    ``usage_hours``; leaves every derived relation as a temp table there, but those in
    :data:`STREAMED` (temp views: read once, by the next relation)."""
    for name, sql in relations(n_keys, method, cost, window, "duckdb"):
        kind = "VIEW" if name in STREAMED else "TABLE"
        con.execute(f"CREATE OR REPLACE TEMP {kind} {name} AS {sql}")


def session_conf(shuffle_partitions: int = 4, driver_memory: str = "2g",
                 conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of the local session :func:`spark_session` makes: UTC, no UI, few shuffle
    partitions, ANSI overflow errors, and no cap on the results collected to the driver
    (``spark.driver.maxResultSize``: Spark's default of 1g fails a bill of ~100M lines,
    whose ``gpu_lines`` hold one row per GPU resource and charge period); ``conf`` last,
    so it overrides any of them."""
    out = {"spark.sql.session.timeZone": "UTC",
           "spark.sql.shuffle.partitions": str(shuffle_partitions),
           "spark.driver.memory": driver_memory,
           "spark.driver.maxResultSize": "0",
           "spark.ui.enabled": "false",
           "spark.ui.showConsoleProgress": "false",
           "spark.sql.ansi.enabled": "true"}
    out.update(conf or {})
    return out


def spark_session(master: str = "local[2]", *, shuffle_partitions: int = 4,
                  driver_memory: str = "2g", conf: Mapping[str, str] | None = None) -> Any:
    """A Spark session for the join: the active one if there is one, else a new one on
    ``master`` (``local[2]``, or a cluster's URL: ``yarn``, ``spark://host:7077``,
    ``k8s://...``) with :func:`session_conf`'s settings."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise InputError("--engine spark needs pyspark",
                         fix="pip install 'gpuaudit[spark]' (and a Java 17+ runtime, e.g. "
                         "apt-get install default-jre-headless)") from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    b = SparkSession.builder.master(master).appName("gpuaudit-bill")
    for k, v in session_conf(shuffle_partitions, driver_memory, conf).items():
        b = b.config(k, v)
    try:
        return b.getOrCreate()
    except Exception as e:  # the JVM's reason is on stderr; pyspark's error says it exited
        raise InputError(f"cannot start a Spark session on master {master!r}: {e}",
                         fix="check the master URL (yarn, spark://HOST:7077, k8s://..., "
                         "local[N]), the --spark-conf settings, and that a Java 17+ runtime "
                         "is installed (java -version)") from None


def _to_arrow(df: Any) -> pa.Table:
    if hasattr(df, "toArrow"):  # pyspark >= 4.0
        return df.toArrow()
    return pa.Table.from_pandas(df.toPandas(), preserve_index=False)  # pragma: no cover


def run_spark(spark: Any, inputs: Mapping[str, str | Path | pa.Table], n_keys: int,
              method: str, cost: str, window: tuple[str, str] | None) -> dict[str, pa.Table]:
    """Run the join on ``spark`` and collect ``gpu_lines``, ``alloc`` and ``period_totals``.

    ``inputs``: each of ``bill_lines``, ``gpu_skus``, ``host_map``, ``usage_hours`` as a
    Parquet path (a file or a partitioned folder), a table name in Spark's catalog, or an
    Arrow table (written to a temporary Parquet file first).
    """
    missing = [n for n in INPUTS if n not in inputs]
    if missing:
        raise ValueError(f"missing inputs {missing}")
    prev_tz = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        with tempfile.TemporaryDirectory(prefix="gpuaudit-spark-") as tmp:
            for name in INPUTS:
                src = inputs[name]
                if isinstance(src, pa.Table):
                    p = Path(tmp) / f"{name}.parquet"
                    pq.write_table(src, p)
                    df = spark.read.parquet(p.as_uri())
                elif isinstance(src, Path) or "/" in src or src.endswith(".parquet"):
                    # a Path is local (file://); a string is Spark's (s3a://, hdfs://, ..)
                    df = spark.read.parquet(src.absolute().as_uri() if isinstance(src, Path)
                                            else str(src))
                else:
                    df = spark.table(src)
                df.createOrReplaceTempView(name)
            for name, sql in relations(n_keys, method, cost, window, "spark"):
                df = spark.sql(sql)
                if name in ("line_groups", "weights"):
                    df = df.persist()  # read twice; row_number() is ordered, so stable
                df.createOrReplaceTempView(name)
            out = {}
            for name in RESULTS:
                t = _to_arrow(spark.table(name))
                out[name] = t
            for name in ("line_groups", "weights"):
                spark.table(name).unpersist()
            return out
    finally:
        spark.conf.set("spark.sql.session.timeZone", prev_tz)


def load_results(con: Any, results: Mapping[str, pa.Table]) -> None:
    """Put an engine's results into DuckDB ``con`` as the temp tables DuckDB's run makes
    (integer units as HUGEINT)."""
    for name in RESULTS:
        t = results[name]
        view = f"_{name}_arrow"
        con.register(view, t)
        cols = ", ".join(
            f"CAST({c} AS HUGEINT) AS {c}" if c in _UNIT_COLUMNS[name] else c
            for c in t.column_names)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {cols} FROM {view}")
        con.unregister(view)
