"""The bill join at scale: a 10M-line FOCUS bill (1,000 instances hourly for a year, plus
storage lines) split over 1,000 GPUs x 30 days of 1-minute telemetry, gpuaudit vs a plain
pandas join of the same data, each in a fresh process.

    python benchmarks/bench_bill.py                  # gpuaudit only
    python benchmarks/bench_bill.py --pandas         # with the pandas column (pip install pandas)
    python benchmarks/bench_bill.py --engines        # the join alone: DuckDB vs Spark local
    python benchmarks/bench_bill.py --engines --instances 11300 --nodes 1250 \
        --shuffle-partitions 32 --driver-memory 8g   # 100,231,920 lines, 10,000 GPUs measured
    python benchmarks/bench_bill.py --baseline-src /tmp/main/src  # interleaved with main

``--engines`` times the join alone (issue 23), each engine in a fresh process over the same
four Parquet inputs (the canonical ``bill_lines`` of the generated bill, ``gpu_skus``,
``host_map`` and a synthetic ``usage_hours`` of the 125 measured nodes x 30 days x ten
groups), written once by ``allocate(..., sql_dir=...)``: DuckDB in-process vs pyspark in local
mode (default ``local[2]``, 4 shuffle partitions, driver memory 6g; ``--spark-master``,
``--shuffle-partitions``, ``--driver-memory``, ``--spark-conf KEY=VALUE`` change them; JVM start
included). Peak memory is the whole process tree's RSS (the JVM is a child of the Python
process), polled every 0.1 s, and CPU the tree's user + system seconds (each process's, last
seen while it ran). The two engines' ``alloc`` results are compared row for row (exact units).
``--engine duckdb|spark`` runs one of them, ``--repeat N`` each N times (interleaved),
``--prepare-only`` only writes the inputs, ``--compare A B`` compares two ``alloc`` files.
``--nodes`` sets how many of the instances are measured p5.48xlarge nodes (default 125);
``usage_hours`` is those nodes x 720 hours x ten groups.

The input is SYNTHETIC, generated once under benchmarks/_work/ (git-ignored):

- telemetry: 125 nodes x 8 GPUs (NVIDIA H100), one sample a minute for 30 days from
  2026-10-01 (43,200,000 rows), a gpuaudit Parquet recording (zstd, ~1M-row row groups); each
  GPU held by a pod of one of ten namespaces (every tenth GPU by nobody), with one of five
  utilization shapes;
- bill: FOCUS 1.2 Parquet, 2026-01-01 .. 2026-12-31 hourly: the 125 measured nodes as
  p5.48xlarge (on demand, some on spot or a commitment), 875 other instances (g5, g6, p4d,
  m5, c5), and 142 storage buckets: 10,003,920 lines, written by DuckDB.

Timings are wall seconds and peak RSS of the whole child process (plus the classify worker it
starts, which runs at the same time), median of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORK = Path(__file__).resolve().parent / "_work"
GPUS, NODES, DAYS = 1000, 125, 30
T0_S = 1_790_812_800  # 2026-10-01T00:00:00Z
YEAR0 = "2026-01-01 00:00:00+00"


def generate_telemetry(path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpuaudit.schema import SAMPLE_SCHEMA, build_table

    ticks = DAYS * 24 * 60
    rng = np.random.default_rng(0)
    kinds = rng.integers(0, 5, GPUS)
    uuids = pa.array([f"GPU-{i:08d}-bench" for i in range(GPUS)])
    hosts = pa.array([f"node-{i:04d}" for i in range(NODES)])
    pods = pa.array([None if i % 10 == 9 else f"job-{i:04d}" for i in range(GPUS)], pa.string())
    nss = pa.array([None if i % 10 == 9 else f"team-{i % 10}" for i in range(GPUS)], pa.string())
    meta = {b"gpuaudit.version": b"0.1.0", b"gpuaudit.interval_s": b"60",
            b"gpuaudit.source": b"synthetic",
            b"gpuaudit.origin": b"SYNTHETIC benchmark fleet (benchmarks/bench_bill.py)"}
    per_group = max(1, (1 << 20) // GPUS)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, SAMPLE_SCHEMA.with_metadata(meta), compression="zstd") as w:
        for start in range(0, ticks, per_group):
            n = min(per_group, ticks - start)
            tick = np.repeat(np.arange(start, start + n), GPUS)
            g = np.tile(np.arange(GPUS), n)
            kind = kinds[g]
            noise = rng.normal(0, 4, tick.shape[0])
            u = np.select(
                [kind == 0, kind == 1, kind == 2, kind == 3],
                [np.abs(noise) / 4, np.where((tick // 3 + g) % 2 == 0, 0.0, 100.0),
                 45.0 + noise, 97.0 + noise / 2],
                default=np.where((tick // 120 + g) % 3 == 0, 0.0, 92.0 + noise),
            ).clip(0, 100).round()
            gi = pa.array(g.astype(np.int32))
            table = build_table({
                "ts": pa.array((T0_S + tick * 60) * 10**9).cast(pa.timestamp("ns", "UTC")),
                "host": pa.DictionaryArray.from_arrays(pa.array((g // 8).astype(np.int32)),
                                                       hosts),
                "gpu_uuid": pa.DictionaryArray.from_arrays(gi, uuids),
                "gpu_model": pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(g.shape[0], np.int32)), pa.array(["NVIDIA H100 80GB HBM3"])),
                "util_gpu_pct": pa.array(u.astype(np.float32)),
                "pod": pods.take(gi), "namespace": nss.take(gi),
            })
            w.write_table(table.replace_schema_metadata(meta))
    tmp.rename(path)


def generate_bill(path: Path, instances: int = 1000, nodes: int = NODES) -> None:
    import duckdb

    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    q = f"""
    WITH inst AS (
      SELECT i,
        CASE WHEN i < {nodes} THEN 'p5.48xlarge'
             ELSE ['g5.12xlarge', 'g6.xlarge', 'p4d.24xlarge', 'm5.large', 'c5.2xlarge'][i % 5 + 1]
        END AS itype,
        CASE WHEN i < {nodes} THEN 55.04
             ELSE [5.672, 0.8048, 21.9576, 0.096, 0.34][i % 5 + 1] END AS od,
        CASE WHEN i % 7 = 3 THEN 'Dynamic' WHEN i % 5 = 2 THEN 'Committed'
             ELSE 'Standard' END AS cat
      FROM range({instances}) t(i)
    ), hours AS (SELECT h FROM range(8760) t(h)),
    lines AS (
      SELECT TIMESTAMPTZ '{YEAR0}' + to_hours(h) AS s, i, itype, od, cat FROM inst, hours
    )
    SELECT s AS ChargePeriodStart, s + INTERVAL 1 HOUR AS ChargePeriodEnd,
      'Usage' AS ChargeCategory, cat AS PricingCategory, 'AWS' AS ServiceProviderName,
      'Amazon Elastic Compute Cloud' AS ServiceName,
      printf('i-%017d', i) AS ResourceId,
      CASE WHEN i < {nodes} THEN printf('node-%04d', i) ELSE printf('ip-10-1-%d', i) END
        AS ResourceName,
      'USE1-' || CASE cat WHEN 'Dynamic' THEN 'SpotUsage' ELSE 'BoxUsage' END || ':' || itype
        AS x_UsageType,
      1.0::DOUBLE AS ConsumedQuantity, 'Hours' AS ConsumedUnit,
      CAST(CASE cat WHEN 'Dynamic' THEN od * 0.41 WHEN 'Committed' THEN 0 ELSE od END
           AS DECIMAL(38,10)) AS BilledCost,
      CAST(CASE cat WHEN 'Dynamic' THEN od * 0.41 WHEN 'Committed' THEN od * 0.65 ELSE od END
           AS DECIMAL(38,10)) AS EffectiveCost,
      CAST(od AS DECIMAL(38,10)) AS ListCost, 'USD' AS BillingCurrency
    FROM lines
    UNION ALL
    SELECT TIMESTAMPTZ '{YEAR0}' + to_hours(h), TIMESTAMPTZ '{YEAR0}' + to_hours(h + 1),
      'Usage', 'Standard', 'AWS', 'Amazon Simple Storage Service', printf('arn:aws:s3:::b%d', b),
      NULL, 'USE1-TimedStorage-ByteHrs', 1.0, 'GB-Mo',
      CAST(0.0001234567 * (b + 1) AS DECIMAL(38,10)),
      CAST(0.0001234567 * (b + 1) AS DECIMAL(38,10)),
      CAST(0.0001234567 * (b + 1) AS DECIMAL(38,10)), 'USD'
    FROM range(142) t(b), hours
    """
    tmp = path.with_suffix(".tmp")
    con.execute(f"COPY ({q}) TO '{tmp}' (FORMAT parquet, COMPRESSION zstd, "
                "ROW_GROUP_SIZE 1000000)")
    tmp.rename(path)


GPUAUDIT_CHILD = r"""
import sys, time, resource, json
t = time.perf_counter()
from gpuaudit.cli import main
rc = main(["bill", sys.argv[1], "--telemetry", sys.argv[2], "--by", "namespace",
           "--format", "json", "-o", sys.argv[3]])
wall = time.perf_counter() - t
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
d = json.load(open(sys.argv[3]))["extra"]["bill"]["currencies"]["USD"]
lines = {ln["line"]: ln["amount"] for ln in d["lines"]}
print(json.dumps({"rc": rc, "wall_s": wall, "rss_mib": me.ru_maxrss / 1024,
                  "child_rss_mib": kids.ru_maxrss / 1024,
                  "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                  "bill_lines": d["bill_lines"], "billed": d["reconciliation"]["billed"],
                  "difference": d["reconciliation"]["difference"],
                  "exact": d["reconciliation"]["every_period_exact"],
                  "team0": lines.get("team-0"), "idle": lines.get("idle (held by nobody)"),
                  "outside": lines.get("unallocated (outside telemetry)")}))
"""

PANDAS_CHILD = r"""
import sys, time, resource, json
t = time.perf_counter()
import numpy as np, pandas as pd
bill = pd.read_parquet(sys.argv[1], columns=["ChargePeriodStart", "ResourceName",
                                             "x_UsageType", "BilledCost"])
bill["BilledCost"] = bill["BilledCost"].astype(float)
gpus = pd.DataFrame({"itype": ["p5.48xlarge", "g5.12xlarge", "g6.xlarge", "p4d.24xlarge"],
                     "gpus": [8, 4, 1, 8]})
bill["itype"] = bill["x_UsageType"].str.split(":").str[-1]
bill = bill.merge(gpus, on="itype", how="left")
gpu = bill[bill["gpus"].notna()]
tel = pd.read_parquet(sys.argv[2], columns=["ts", "host", "util_gpu_pct", "pod", "namespace"])
tel["hour"] = tel["ts"].dt.floor("h")
tel["held"] = tel["pod"].notna()
tel["ns"] = tel["namespace"].astype("object").where(tel["held"], "idle (held by nobody)")
tel["sec"] = 60.0
meas = tel.groupby(["host", "hour", "ns"], observed=True)["sec"].sum().reset_index()
meas["host"] = meas["host"].astype(str)
j = gpu.merge(meas, left_on=["ResourceName", "ChargePeriodStart"], right_on=["host", "hour"],
              how="left")
j["share"] = (j["sec"] / (j["gpus"] * 3600.0)).fillna(0.0)
j["alloc"] = j["BilledCost"] * j["share"]
by = j.groupby("ns")["alloc"].sum()
total = gpu["BilledCost"].sum()
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "bill_lines": int(len(bill)), "billed": round(float(total), 2),
                  "team0": round(float(by.get("team-0", 0.0)), 2),
                  "idle": round(float(by.get("idle (held by nobody)", 0.0)), 2),
                  "unallocated": round(float(total - by.sum()), 2)}))
"""


ENGINE_CHILD = r"""
import sys, time, json
t = time.perf_counter()
from pathlib import Path
engine, d, ws, we, out, spark_json = sys.argv[1:7]
w = (ws, we)
from gpuaudit.price.billing.sql.join import INPUTS
if engine == "duckdb":
    import duckdb
    from gpuaudit.price.billing.sql.engines import run_duckdb
    con = duckdb.connect()
    con.execute("SET TimeZone='UTC'")
    sc = json.loads(spark_json)
    if sc.get("duckdb_memory_limit"):
        con.execute(f"SET memory_limit='{sc['duckdb_memory_limit']}'")
        con.execute(f"SET temp_directory='{Path(out).parent / 'duckdb_tmp'}'")
    for n in INPUTS:
        con.execute(f"CREATE VIEW {n} AS SELECT * FROM read_parquet('{d}/{n}.parquet')")
    run_duckdb(con, 1, "allocation", "billed", w)
    # Parquet has no 128-bit integer (DuckDB would write HUGEINT as DOUBLE): exact types
    con.execute(f"COPY (SELECT * REPLACE (CAST(units AS DECIMAL(38,0)) AS units, "
                f"CAST(gpu_ms AS BIGINT) AS gpu_ms) FROM alloc) TO '{out}' (FORMAT parquet)")
else:
    import pyarrow.parquet as pq
    from gpuaudit.price.billing.sql.engines import run_spark, spark_session
    sc = json.loads(spark_json)
    spark = spark_session(sc["master"], shuffle_partitions=sc["shuffle_partitions"],
                          driver_memory=sc["driver_memory"], conf=sc["conf"])
    spark.sparkContext.setLogLevel("ERROR")
    res = run_spark(spark, {n: Path(d) / f"{n}.parquet" for n in INPUTS}, 1, "allocation",
                    "billed", w)
    pq.write_table(res["alloc"], out)
    spark.stop()
print(json.dumps({"wall_s": time.perf_counter() - t}))
"""


def _tree(root: int) -> list[int]:
    """``root`` and every live descendant (from /proc)."""
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _tree_rss_mib(root: int) -> float:
    """RSS of ``root`` and every descendant (from /proc), MiB."""
    total = 0
    for pid in _tree(root):
        try:
            for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
                if ln.startswith("VmRSS:"):
                    total += int(ln.split()[1])
        except OSError:
            continue
    return total / 1024


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` itself (clock ticks), None when gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(f[11]) + int(f[12])


def run_engine(engine: str, inputs: Path, window: tuple[str, str], out: Path,
               spark_conf: dict[str, object]) -> dict[str, float]:
    """One engine in a fresh process: wall, peak RSS of the process tree (polled every 0.1 s)
    and the CPU seconds of the tree (each process's own utime + stime, last seen while it
    ran; the JVM child included)."""
    p = subprocess.Popen([sys.executable, "-c", ENGINE_CHILD, engine, str(inputs), *window,
                          str(out), json.dumps(spark_conf)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, ticks = 0.0, {}
    t = time.perf_counter()
    while p.poll() is None:
        peak = max(peak, _tree_rss_mib(p.pid))
        for pid in _tree(p.pid):
            c = _cpu_ticks(pid)
            if c is not None:
                ticks[pid] = c
        time.sleep(0.1)
    wall = time.perf_counter() - t
    stdout, stderr = p.communicate()
    if p.returncode != 0:
        first = [ln for ln in stderr.splitlines()
                 if ("Error" in ln or "Exception" in ln) and not ln.startswith("\tat ")][:5]
        raise SystemExit(f"{engine} failed after {wall:.0f} s (exit status {p.returncode}; "
                         f"peak RSS {peak:.0f} MiB):\n"
                         + "\n".join(ln[:1000] for ln in first) + "\n...\n" + stderr[-3000:])
    inner = json.loads(stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "inner_wall_s": inner["wall_s"], "peak_rss_mib": peak,
            "cpu_s": sum(ticks.values()) / os.sysconf("SC_CLK_TCK")}


def prepare_engine_inputs(bill: Path, inputs: Path, nodes: int = NODES) -> tuple[str, str]:
    """The join's four inputs as Parquet under ``inputs``; returns the telemetry window."""
    from datetime import datetime, timedelta, timezone

    import numpy as np
    import pyarrow as pa

    from gpuaudit.price.billing import open_bill
    from gpuaudit.price.billing.allocate import allocate

    t0 = datetime.fromtimestamp(T0_S, tz=timezone.utc)
    hours = DAYS * 24
    h = np.repeat(np.arange(hours), nodes * 10)
    node = np.tile(np.repeat(np.arange(nodes), 10), hours)
    grp = np.tile(np.arange(10), hours * nodes)
    rng = np.random.default_rng(1)
    ms = rng.integers(0, 2_880_000, (5, h.size)) // 4  # <= 8 GPUs x 3.6e6 ms over 10 groups
    usage = pa.table({
        "host": pa.DictionaryArray.from_arrays(
            pa.array(node.astype(np.int32)),
            pa.array([f"node-{i:04d}" for i in range(nodes)])).cast(pa.string()),
        "period_start": pa.array((T0_S + h * 3600).astype("int64")).cast(
            pa.timestamp("s", "UTC")),
        "held": pa.array(grp != 9),
        "g_0": pa.array([None if g == 9 else f"team-{g}" for g in grp], pa.string()),
        "idle_ms": ms[0], "underutilized_ms": ms[1], "productive_ms": ms[2],
        "compute_bound_ms": ms[3], "unobserved_ms": ms[4] // 10})
    window = (t0, t0 + timedelta(hours=hours))
    allocate(open_bill(bill), usage, ["namespace"], window=window, sql_dir=inputs)
    return (t0.isoformat().replace("+00:00", "Z"),
            window[1].isoformat().replace("+00:00", "Z"))


def engines_main(args: argparse.Namespace) -> None:
    import pyarrow.parquet as pq

    instances, nodes = args.instances, args.nodes
    tag = "" if nodes == NODES else f"_{nodes}nodes"
    bill = WORK / ("bill_focus_10m.parquet" if (instances, nodes) == (1000, NODES)
                   else f"bill_focus_{instances}inst{tag}.parquet")
    if not bill.exists():
        t = time.perf_counter()
        generate_bill(bill, instances, nodes)
        print(f"generated {bill.name} in {time.perf_counter() - t:.0f} s "
              f"({bill.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)
    inputs = WORK / f"join_inputs_{instances}{tag}"
    wfile = inputs / "window.json"
    if not wfile.exists():
        t = time.perf_counter()
        window = prepare_engine_inputs(bill, inputs, nodes)
        wfile.write_text(json.dumps(window))
        print(f"prepared the join's inputs in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    if args.prepare_only:
        return
    window = tuple(json.loads(wfile.read_text()))
    assert len(window) == 2
    n = pq.ParquetFile(inputs / "bill_lines.parquet").metadata.num_rows
    u = pq.ParquetFile(inputs / "usage_hours.parquet").metadata.num_rows
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"machine: {os.cpu_count()} cores, {cpu}; python {platform.python_version()}")
    conf = dict(kv.split("=", 1) for kv in args.spark_conf)
    spark_conf = {"master": args.spark_master, "shuffle_partitions": args.shuffle_partitions,
                  "driver_memory": args.driver_memory, "conf": conf,
                  "duckdb_memory_limit": args.duckdb_memory_limit}
    engines = args.engine or ["duckdb", "spark"]
    print(f"inputs: {n:,} bill lines, {u:,} usage_hours rows; spark: {json.dumps(spark_conf)}")
    res: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
    for i in range(args.repeat):
        for engine in engines:
            before = os.getloadavg()
            out = WORK / f"alloc_{engine}{tag}_{instances}_{i}.parquet"
            r = run_engine(engine, inputs, (window[0], window[1]), out, spark_conf)
            res[engine].append(r)
            print(f"{engine:6s} run {i + 1}: {n:,} bill lines  wall {r['wall_s']:.1f} s "
                  f"(in-process {r['inner_wall_s']:.1f} s)  cpu (tree) {r['cpu_s']:.1f} s  "
                  f"peak RSS (tree) {r['peak_rss_mib']:.0f} MiB  load before "
                  f"{' '.join(f'{x:.2f}' for x in before)}  after "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for engine, rs in res.items():
        walls = sorted(r["wall_s"] for r in rs)
        print(f"{engine:6s} wall min {walls[0]:.1f} median {statistics.median(walls):.1f} s; "
              f"peak RSS max {max(r['peak_rss_mib'] for r in rs):.0f} MiB")
    if len(engines) == 2 or args.compare:
        compare_allocs(*(args.compare or [
            str(WORK / f"alloc_{e}{tag}_{instances}_0.parquet") for e in ("duckdb", "spark")]))


def compare_allocs(first: str, second: str) -> bool:
    """The two engines' ``alloc`` results, row for row (exact units)."""
    import pyarrow.parquet as pq

    keys = ["currency", "charge_start", "charge_end", "kind", "reason", "g_0", "phase"]
    a, b = (pq.read_table(f) for f in (first, second))
    a = a.sort_by([(k, "ascending") for k in keys])
    b = b.sort_by([(k, "ascending") for k in keys])
    same = a.num_rows == b.num_rows and all(
        a.column(c).to_pylist() == b.column(c).to_pylist() for c in (*keys, "units", "gpu_ms"))
    total = sum(a.column("units").to_pylist()) if a.num_rows else 0
    print(f"alloc rows {a.num_rows:,} / {b.num_rows:,}; identical to the unit: {same}; "
          f"units sum {total} ({Path(first).name} vs {Path(second).name})")
    return same


def run_child(code: str, *args: str, src: str | None = None) -> dict[str, object]:
    """``code`` in a fresh interpreter; ``src``: import gpuaudit from that source folder
    (a baseline checkout, ``git worktree add``) instead of this one."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    # each process's own peak (VmHWM), polled until it exits: the children's ru_maxrss
    # may be the parent's peak (a forked child starts with its parent's pages counted)
    hwm: dict[int, float] = {}
    while p.poll() is None:
        for pid, kib in _tree_hwm_kib(p.pid).items():
            hwm[pid] = max(hwm.get(pid, 0.0), kib)
        time.sleep(0.1)
    stdout, stderr = p.communicate()
    if p.returncode != 0:
        raise SystemExit(stderr[-3000:])
    result: dict[str, object] = json.loads(stdout.strip().splitlines()[-1])
    result["hwm_main_mib"] = hwm.get(p.pid, 0.0) / 1024
    result["hwm_workers_mib"] = sum(v for k, v in hwm.items() if k != p.pid) / 1024
    return result


def _tree_hwm_kib(root: int) -> dict[int, float]:
    """VmHWM (peak RSS, KiB) of ``root`` and each of its descendants now alive."""
    kids: dict[int, list[int]] = {}
    for q in Path("/proc").iterdir():
        if q.name.isdigit():
            try:
                ppid = int((q / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(q.name))
    out: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, []))
        try:
            for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
                if ln.startswith("VmHWM:"):
                    out[pid] = float(ln.split()[1])
        except OSError:
            continue
    return out


def median_of(code: str, repeat: int, *args: str) -> dict[str, object]:
    runs = [run_child(code, *args) for _ in range(repeat)]
    walls = [float(r["wall_s"]) for r in runs]  # type: ignore[arg-type]
    best = runs[walls.index(statistics.median(walls))] if repeat % 2 else runs[0]
    return {**best, "wall_s": statistics.median(walls), "walls": walls,
            "rss_mib": max(float(r["rss_mib"]) for r in runs),  # type: ignore[arg-type]
            "child_rss_mib": max(float(r.get("child_rss_mib", 0.0)) for r in runs)}  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs of each (default 3; --engines: 1)")
    ap.add_argument("--pandas", action="store_true", help="also run the plain pandas join")
    ap.add_argument("--no-gpuaudit", action="store_true", help="run the pandas join only")
    ap.add_argument("--engines", action="store_true",
                    help="time the join alone on DuckDB and on Spark local (pip install pyspark)")
    ap.add_argument("--instances", type=int, default=1000,
                    help="instances in the generated bill, 8,760 lines each plus 1,243,920 "
                    "storage lines (1000: 10,003,920 lines; 11300: 100,231,920)")
    ap.add_argument("--nodes", type=int, default=NODES,
                    help="--engines: of those instances, the measured p5.48xlarge nodes; "
                    "usage_hours holds nodes x 720 hours x ten groups (125: 900,000 rows)")
    ap.add_argument("--engine", action="append", choices=["duckdb", "spark"],
                    help="--engines: run only this engine (repeatable; default both)")
    ap.add_argument("--prepare-only", action="store_true",
                    help="--engines: generate the bill and the join's inputs, run nothing")
    ap.add_argument("--compare", nargs=2, metavar="ALLOC", default=None,
                    help="--engines: compare these two alloc Parquet files row for row")
    ap.add_argument("--duckdb-memory-limit", default=None, metavar="SIZE",
                    help="--engines: DuckDB's memory_limit (e.g. 4GB; it spills past it to "
                    "benchmarks/_work/duckdb_tmp); default DuckDB's own, 80%% of RAM")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="--engines: more Spark settings (repeatable)")
    ap.add_argument("--baseline-src", default=None, metavar="DIR",
                    help="also run the gpuaudit of this src folder (e.g. main checked out with "
                    "git worktree add), interleaved run by run with this one")
    args = ap.parse_args()
    if args.engines:
        args.repeat = args.repeat or 1
        if args.compare and not args.engine:
            compare_allocs(*args.compare)
            return
        engines_main(args)
        return
    args.repeat = args.repeat or 3
    tel = WORK / f"bill_telemetry_{GPUS}gpu_{DAYS}d_1m.parquet"
    bill = WORK / "bill_focus_10m.parquet"
    for path, gen in ((tel, generate_telemetry), (bill, generate_bill)):
        if not path.exists():
            t = time.perf_counter()
            gen(path)
            print(f"generated {path.name} in {time.perf_counter() - t:.0f} s "
                  f"({path.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    print(f"machine: {os.cpu_count()} cores, {cpu}; python {platform.python_version()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    out = WORK / "bill_report.json"
    if args.baseline_src:
        interleaved(args.repeat, args.baseline_src, str(bill), str(tel), str(out))
        return
    if args.no_gpuaudit:
        g = None
    else:
        g = median_of(GPUAUDIT_CHILD, args.repeat, str(bill), str(tel), str(out))
    if g is not None:
        _show(g)
    if args.pandas:
        p = median_of(PANDAS_CHILD, args.repeat, str(bill), str(tel))
        print(f"pandas join:   {p['bill_lines']:,} bill lines  {p['wall_s']:.2f} s (runs "
              f"{', '.join(f'{w:.1f}' for w in p['walls'])})  peak RSS {p['rss_mib']:.0f} MiB  "  # type: ignore[union-attr]
              f"billed {p['billed']}  team-0 {p['team0']}  idle {p['idle']}  "
              f"unallocated {p['unallocated']}")
        print(f"load average after pandas: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def interleaved(repeat: int, base_src: str, *args: str) -> None:
    """Baseline and this checkout run by run (base, this, base, this, ...), each a fresh
    process; wall min and median, CPU, peak RSS, the load average before each run, and
    whether the two reports' bill sections are equal."""
    runs: dict[str, list[dict[str, object]]] = {"baseline": [], "this": []}
    for _ in range(repeat):
        for name, src in (("baseline", base_src), ("this", None)):
            load = os.getloadavg()[0]
            r = run_child(GPUAUDIT_CHILD, *args, src=src)
            r["load_before"] = load
            runs[name].append(r)
            print(f"{name:8s} wall {float(r['wall_s']):6.2f} s  cpu "  # type: ignore[arg-type]
                  f"{float(r['cpu_s']):6.1f} s  VmHWM {float(r['hwm_main_mib']):5.0f} + worker "  # type: ignore[arg-type]
                  f"{float(r['hwm_workers_mib']):4.0f} MiB  load before {load:.2f}  billed "  # type: ignore[arg-type]
                  f"{r['billed']} diff {r['difference']} exact {r['exact']} team-0 "
                  f"{r['team0']} idle {r['idle']}", flush=True)
    for name, rs in runs.items():
        walls = sorted(float(r["wall_s"]) for r in rs)  # type: ignore[arg-type]
        cpus = [float(r["cpu_s"]) for r in rs]  # type: ignore[arg-type]
        print(f"{name:8s} wall min {walls[0]:.2f} median {statistics.median(walls):.2f} s "
              f"(runs {', '.join(f'{w:.2f}' for w in walls)}); cpu median "
              f"{statistics.median(cpus):.1f} s; peak VmHWM main + worker "
              f"{max(float(r['hwm_main_mib']) + float(r['hwm_workers_mib']) for r in rs):.0f} MiB")  # type: ignore[arg-type]
    same = {k: v for k, v in runs["baseline"][0].items() if k in (
        "billed", "difference", "exact", "team0", "idle", "outside")} == {
        k: v for k, v in runs["this"][0].items() if k in (
            "billed", "difference", "exact", "team0", "idle", "outside")}
    print(f"same figures: {same}; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _show(g: dict[str, object]) -> None:
    kids = float(g["child_rss_mib"])  # type: ignore[arg-type]
    print(f"gpuaudit bill: {g['bill_lines']:,} bill lines x 43,200,000 samples  "
          f"{g['wall_s']:.2f} s (runs {', '.join(f'{w:.1f}' for w in g['walls'])})  "  # type: ignore[union-attr]
          f"peak RSS {g['rss_mib']:.0f} MiB"
          + (f" + worker {kids:.0f} MiB = {float(g['rss_mib']) + kids:.0f} MiB" if kids else "")  # type: ignore[arg-type]
          + f"  cpu {float(g['cpu_s']):.1f} s  billed {g['billed']} difference "  # type: ignore[arg-type]
          f"{g['difference']} every period exact {g['exact']}  team-0 {g['team0']}  "
          f"idle {g['idle']}  outside telemetry {g['outside']}")
    print(f"load average after gpuaudit: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
