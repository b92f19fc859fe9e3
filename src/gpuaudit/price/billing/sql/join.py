"""The join, defined once: GPU bill lines to the GPU time measured on the same node in the
same hours, emitted for DuckDB, Spark SQL, Trino/Athena and BigQuery (``dialects.py``).

Five input relations (their DDL: :func:`inputs_ddl`):

- ``bill_lines``: the canonical bill (``readers.py``);
- ``gpu_skus(sku_text, instance, gpu_model, gpus_per_instance, per_gpu)``: the GPU SKUs found
  in the catalog (``gpu_lines.py``);
- ``host_map(resource_id, host)``: which telemetry host a bill resource is;
- ``usage_hours(host, period_start, held, g_0 .. g_n, idle_ms, underutilized_ms,
  productive_ms, compute_bound_ms, unobserved_ms)``: measured GPU time per host, hour and
  group (classify's ``period:3600`` cells summed over the host's GPUs), in integer
  milliseconds;
- ``split_groups(split_key, kind, reason, g_0 .. g_n)``: where each line the provider split
  itself (FOCUS 1.3 ``Allocated*``, ``bill_lines.line_role = 'provider split'``) goes, by
  :func:`split_key`: such a line goes whole to that group, never over the node's measured
  time, and a credit, refund or adjustment on the same resource and charge period follows
  that split. Lines of a commitment's purchase or unused part are no GPU time and stay out.

Nine relations derived in order (:func:`relations`), each a plain ``SELECT`` over the inputs
and the ones before it; an engine adapter materializes each under its name. Three are the
results: ``gpu_lines``, ``alloc`` and ``period_totals``. The first, ``gpu_periods`` (the GPU
lines summed per charge period), reads the bill and ``gpu_skus`` alone.

Money is integer units of 1e-12 (``DECIMAL(38,12)`` scaled) in a 38-digit decimal, so every
allocation is an integer product and an exact truncating integer division: no float. Each
GPU line's cost is split over its node's capacity ``W = max(billed GPU-ms, measured GPU-ms)``
in the line's charge period: measured time to the teams (method ``allocation``: every phase of
the time a team held; method ``usage``: the non-idle phases, a team's idle time going to
``idle``), time held by nobody to ``idle``, and billed time without telemetry to
``unallocated`` (with its reason). Lines with nothing measured to split them by (outside the
telemetry's window, or on a node never measured) are summed per charge period and go to
``unallocated`` whole. The integer division leaves less than one unit (1e-12) per weight; the
reconciliation (``reconcile.py``) rounds each charge period against its exact billed total.

Portable by construction: no ``GROUP BY ALL``, no temp-table syntax (the adapter's), every
``row_number()`` ordered by a unique key, timestamps compared as instants and differenced in
whole milliseconds by the dialect's function.
"""

from __future__ import annotations

from gpuaudit.price.billing.sql.dialects import DIALECTS, Dialect

__all__ = ["COST_COLUMNS", "INPUTS", "METHODS", "PHASE_COLS", "RESULTS", "UNITS_PER_USD",
           "inputs_ddl", "relations", "script"]

METHODS: tuple[str, ...] = ("allocation", "usage")
UNITS_PER_USD = 1_000_000_000_000  # 1e-12 USD: the scale of DECIMAL(38,12)
PHASE_COLS = ("idle", "underutilized", "productive", "compute_bound")
COST_COLUMNS = {"billed": "billed_cost", "effective": "effective_cost", "list": "list_cost"}
INPUTS = ("bill_lines", "gpu_skus", "host_map", "usage_hours", "split_groups")
#: line_role values (readers.py) of lines that are not GPU time: a commitment's purchase and
#: its unused part go to the ``commitment`` bucket whole, never split over a node's time
COMMITMENT_ROLES = ("commitment purchase", "unused commitment")
#: the phase of a line the provider split itself (FOCUS 1.3 Allocated*): no measured phase
PROVIDER_PHASE = "provider_split"
RESULTS = ("gpu_lines", "alloc", "period_totals")

# the columns of bill_lines the join reads (readers.py makes more)
_BILL_COLUMNS = (
    ("currency", "string"), ("resource_id", "string"), ("resource_name", "string"),
    ("sku_text", "string"), ("service", "string"), ("charge_category", "string"),
    ("pricing_category", "string"), ("charge_start", "timestamp"),
    ("charge_end", "timestamp"), ("quantity", "qty"), ("unit", "string"),
    ("billed_cost", "money"), ("effective_cost", "money"), ("list_cost", "money"),
    ("line_role", "string"), ("allocated_resource_id", "string"),
    ("allocated_resource_name", "string"), ("allocated_tags", "string"))


def split_key(b: str = "b") -> str:
    """The key of a provider-split line's target (FOCUS 1.3 ``AllocatedTags`` and
    ``AllocatedResourceName``/``Id``), matched against ``split_groups.split_key``."""
    return (f"(COALESCE({b}.allocated_tags, '') || '|' || COALESCE({b}.allocated_resource_name, "
            f"{b}.allocated_resource_id, ''))")


def _dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; one of {', '.join(DIALECTS)}") from None


def inputs_ddl(n_keys: int, dialect: str) -> str:
    """``CREATE TABLE`` statements for the five input relations the query expects."""
    d = _dialect(dialect)

    def typ(kind: str) -> str:
        return str(getattr(d, kind))

    tables = {
        "bill_lines": [(c, typ(k)) for c, k in _BILL_COLUMNS],
        "gpu_skus": [("sku_text", d.string), ("instance", d.string), ("gpu_model", d.string),
                     ("gpus_per_instance", d.bigint), ("per_gpu", d.boolean)],
        "host_map": [("resource_id", d.string), ("host", d.string)],
        "usage_hours": [("host", d.string), ("period_start", d.timestamp),
                        ("held", d.boolean), *((f"g_{i}", d.string) for i in range(n_keys)),
                        *((f"{p}_ms", d.bigint) for p in (*PHASE_COLS, "unobserved"))],
        "split_groups": [("split_key", d.string), ("kind", d.string), ("reason", d.string),
                         *((f"g_{i}", d.string) for i in range(n_keys))],
    }
    return "\n".join(
        f"CREATE TABLE {name} (\n  " + ",\n  ".join(f"{c} {t}" for c, t in cols) + "\n);\n"
        for name, cols in tables.items())


def _billed_gpu_ms(d: Dialect) -> str:
    # GPU-ms a usage line covers: its quantity when the unit is hours (or seconds), else the
    # charge period's length, times the GPUs it prices. Credits and refunds cover no time
    # (their cost still splits). Exact decimal, rounded half away from zero to whole ms.
    # the integer factor as DECIMAL(12,0): quantity (26,12) x (12,0) = (38,12), exact in
    # every engine (no scale cut before the rounding to whole ms)
    gpus = "(CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END)"
    q = f"CAST(b.quantity AS {d.qty})"

    def per(ms: int) -> str:
        return f"CAST({gpus} * {ms} AS {d.factor})"

    def rounded(ms: int) -> str:
        # a whole quantity (an hourly line's 1 hour) is an integer product, the same value
        # as the decimal one rounded; the 38-digit product and its rounding cost ~0.3 us a
        # line (1.5 s of CPU over 5.7M GPU lines), the integer one a tenth of that
        return (f"CASE WHEN b.quantity = floor(b.quantity) AND abs(b.quantity) < 1000000 "
                f"THEN CAST(b.quantity AS {d.bigint}) * {gpus} * {ms} "
                f"ELSE CAST(round({q} * {per(ms)}) AS {d.bigint}) END")

    return (
        "CASE WHEN b.charge_category <> 'Usage' OR b.billed_cost < 0 THEN 0 "
        "WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('hrs', 'hr', 'hours', 'hour', 'h') "
        f"THEN {rounded(3600000)} "
        "WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('seconds', 'second', 's') "
        f"THEN {rounded(1000)} "
        f"ELSE {d.ms_between('b.charge_start', 'b.charge_end')} * {gpus} END")


def relations(n_keys: int, method: str, cost: str = "billed",
              window: tuple[str, str] | None = None,
              dialect: str = "duckdb") -> list[tuple[str, str]]:
    """``(name, SELECT)`` in dependency order; the last three names include the results.

    ``window``: the telemetry's [start, end) as ISO timestamps (``...Z``); a charge period
    outside it is not covered (its cost is unallocated, reason ``outside telemetry``).
    """
    if method not in METHODS:
        raise ValueError(method)
    d = _dialect(dialect)
    cost_col = COST_COLUMNS[cost]
    gk = [f"g_{i}" for i in range(n_keys)]
    g_null = "".join(f"CAST(NULL AS {d.string}) AS {g}, " for g in gk)
    w_start, w_end = window or ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z")
    units = d.units

    # a line outside the telemetry's window keeps neither its resource nor its host: such
    # lines are summed per charge period (a year's bill beside a month of telemetry: ~10x
    # fewer groups than per node). The sums per charge period need the bill alone
    # (``gpu_periods``); ``gpu_lines`` takes the periods outside the window from it and
    # groups only the lines that meet the window.
    roles = ", ".join(f"'{r}'" for r in COMMITMENT_ROLES)
    gpu_bill = """
  FROM bill_lines b JOIN gpu_skus s ON b.sku_text = s.sku_text"""
    gpu_only = f"b.line_role IS NULL OR b.line_role NOT IN ({roles})"
    outside = f"(b.charge_end <= {d.ts(w_start)} OR b.charge_start >= {d.ts(w_end)})"
    # NOT COALESCE(outside, FALSE), written as two conjuncts of plain comparisons so that an
    # engine reading Parquet skips the row groups whose periods all lie outside the window
    # (DuckDB: 4 of 10 read for a month of a year's hourly bill, ~0.4 s less after classify)
    inside = (f"(b.charge_end > {d.ts(w_start)} OR b.charge_end IS NULL) AND "
              f"(b.charge_start < {d.ts(w_end)} OR b.charge_start IS NULL)")
    split = f"CASE WHEN b.line_role = 'provider split' THEN {split_key('b')} END"
    period_keys = ("currency, charge_start, charge_end, pricing_category, instance, gpu_model, "
                   "split_key")
    gpu_periods = f"""
SELECT {period_keys}, sum(billed_cost) AS billed_cost,
       sum(effective_cost) AS effective_cost, sum(list_cost) AS list_cost,
       sum(billed_gpu_ms) AS billed_gpu_ms, count(*) AS lines
FROM (
  SELECT b.currency, b.charge_start, b.charge_end, b.pricing_category,
         b.billed_cost, b.effective_cost, b.list_cost, s.instance, s.gpu_model,
         {_billed_gpu_ms(d)} AS billed_gpu_ms,
         {split} AS split_key{gpu_bill}
  WHERE {gpu_only}
) x
GROUP BY {period_keys}"""
    gpu_lines_keys = ("currency, resource_id, host, charge_start, charge_end, "
                      "pricing_category, instance, gpu_model, no_data_reason, split_key")
    gpu_lines = f"""
SELECT {gpu_lines_keys}, sum(billed_cost) AS billed_cost,
       sum(effective_cost) AS effective_cost, sum(list_cost) AS list_cost,
       sum(billed_gpu_ms) AS billed_gpu_ms,
       CAST(sum({cost_col}) * {UNITS_PER_USD} AS {units}) AS cost_units,
       count(*) AS lines
FROM (
  SELECT b.currency, b.resource_id, b.charge_start, b.charge_end, b.pricing_category,
         b.billed_cost, b.effective_cost, b.list_cost, s.instance, s.gpu_model, h.host,
         {_billed_gpu_ms(d)} AS billed_gpu_ms,
         CASE WHEN b.line_role = 'provider split' THEN NULL
              WHEN h.host IS NULL THEN 'no telemetry for this node'
              ELSE NULL END AS no_data_reason,
         {split} AS split_key{gpu_bill}
  LEFT JOIN host_map h ON b.resource_id = h.resource_id
  WHERE {inside} AND ({gpu_only})
) x
GROUP BY {gpu_lines_keys}
UNION ALL  -- the charge periods outside the window: their sums, without resource or host
SELECT b.currency, CAST(NULL AS {d.string}), CAST(NULL AS {d.string}), b.charge_start,
       b.charge_end, b.pricing_category, b.instance, b.gpu_model,
       CASE WHEN b.split_key IS NULL THEN 'outside telemetry' END, b.split_key,
       b.billed_cost, b.effective_cost, b.list_cost, b.billed_gpu_ms,
       CAST(b.{cost_col} * {UNITS_PER_USD} AS {units}), b.lines
FROM gpu_periods b WHERE {outside}"""

    # The provider's split (FOCUS 1.3 Allocated*) of each resource and charge period: each
    # target's weight (its cost in 1e-6 of the currency, so a product with a line's units
    # stays within 38 digits) and their total. A credit, refund or adjustment (a line
    # covering no GPU time) on a resource and period the provider split follows that split,
    # like the lines it corrects, instead of the measured time. Two relations of their
    # own, computed once: both line_groups and alloc read them.
    split_weights = f"""
SELECT x.currency, x.resource_id, x.charge_start, x.charge_end, x.split_key,
       {d.idiv('x.k_units', '1000000')} AS k_w
FROM (SELECT currency, resource_id, charge_start, charge_end, split_key,
             sum(cost_units) AS k_units
      FROM gpu_lines WHERE split_key IS NOT NULL AND resource_id IS NOT NULL
      GROUP BY currency, resource_id, charge_start, charge_end, split_key) x"""
    split_totals = """
SELECT currency, resource_id, charge_start, charge_end, sum(k_w) AS w_total
FROM split_weights GROUP BY currency, resource_id, charge_start, charge_end
HAVING sum(k_w) > 0"""

    def on_split(a: str, b: str) -> str:
        return " AND ".join(f"{a}.{k} = {b}.{k}" for k in (
            "currency", "resource_id", "charge_start", "charge_end"))

    follower = "(st.resource_id IS NOT NULL AND g.billed_gpu_ms = 0)"
    lg_keys = "currency, resource_id, host, charge_start, charge_end"
    g_lg = ", ".join(f"g.{k.strip()}" for k in lg_keys.split(","))
    line_groups = f"""
SELECT row_number() OVER (ORDER BY {lg_keys}) AS line_id, l.*
FROM (
  SELECT {g_lg}, sum(g.cost_units) AS cost_units, sum(g.billed_gpu_ms) AS billed_gpu_ms
  FROM gpu_lines g LEFT JOIN split_totals st ON {on_split('g', 'st')}
  WHERE g.no_data_reason IS NULL AND g.split_key IS NULL AND NOT {follower}
  GROUP BY {g_lg}
) l"""

    meas_keys = "line_id, held" + "".join(f", {g}" for g in gk)
    u_cols = ("l.line_id, u.held, " + "".join(f"u.{g}, " for g in gk)
              + ", ".join(f"u.{p}_ms" for p in (*PHASE_COLS, "unobserved")))
    # usage hours start on the hour: a line of one hour at most that starts on the hour
    # (an hourly bill's every line) meets exactly the usage hour starting with it, an
    # equality join; a longer or unaligned line (a daily line) joins its range of hours
    one_hour = (f"{d.ms_between('l.charge_start', 'l.charge_end')} <= 3600000 AND "
                f"MOD({d.ms_between(d.ts('1970-01-01T00:00:00Z'), 'l.charge_start')}, "
                "3600000) = 0")
    meas = f"""
SELECT {meas_keys},
       sum(idle_ms) AS idle_ms, sum(underutilized_ms) AS underutilized_ms,
       sum(productive_ms) AS productive_ms, sum(compute_bound_ms) AS compute_bound_ms,
       sum(unobserved_ms) AS unobserved_ms
FROM (
  SELECT {u_cols}
  FROM line_groups l JOIN usage_hours u
    ON u.host = l.host AND u.period_start = l.charge_start
  WHERE {one_hour}
  UNION ALL
  SELECT {u_cols}
  FROM line_groups l JOIN usage_hours u
    ON u.host = l.host AND u.period_start >= l.charge_start AND u.period_start < l.charge_end
  WHERE NOT ({one_hour})
) x
GROUP BY {meas_keys}"""

    per_phase = []
    for p in PHASE_COLS:
        if method == "allocation":
            kind = "CASE WHEN m.held THEN 'team' ELSE 'idle' END"
        else:
            kind = ("'idle'" if p == "idle"
                    else "CASE WHEN NOT m.held THEN 'idle' ELSE 'team' END")
        reason = "CASE WHEN m.held THEN 'held' ELSE 'unheld' END"
        per_phase.append(
            f"SELECT m.line_id, {kind} AS kind, {reason} AS reason, "
            + "".join(f"m.{g}, " for g in gk)
            + f"'{p}' AS phase, m.{p}_ms AS w FROM meas m")
    weights = f"""
WITH measured AS (
  SELECT line_id, sum(idle_ms + underutilized_ms + productive_ms + compute_bound_ms
                      + unobserved_ms) AS measured_ms
  FROM meas GROUP BY line_id
), caps AS (
  SELECT l.line_id, l.cost_units, COALESCE(m.measured_ms, 0) AS measured_ms,
         greatest(l.billed_gpu_ms, COALESCE(m.measured_ms, 0)) AS cap_ms,
         'telemetry gap' AS no_data_reason
  FROM line_groups l LEFT JOIN measured m ON l.line_id = m.line_id
), parts AS (
  {' UNION ALL '.join(per_phase)}
  UNION ALL
  SELECT m.line_id, 'unallocated' AS kind, 'telemetry gap' AS reason, {g_null}
         'unobserved' AS phase, m.unobserved_ms AS w FROM meas m
  UNION ALL
  SELECT line_id, 'unallocated', no_data_reason, {g_null} 'unobserved',
         cap_ms - measured_ms FROM caps
  UNION ALL  -- a line with no capacity at all (a credit on a node never measured)
  SELECT line_id, 'unallocated', no_data_reason, {g_null} 'unobserved',
         CAST(1 AS {d.bigint}) FROM caps
  WHERE cap_ms = 0
)
SELECT p.*, c.cost_units, greatest(c.cap_ms, 1) AS cap_ms
FROM parts p JOIN caps c ON p.line_id = c.line_id WHERE p.w > 0"""

    a_keys = ("l.currency, l.charge_start, l.charge_end, w.kind, w.reason, "
              + "".join(f"w.{g}, " for g in gk) + "w.phase")
    u_keys_g = "g.currency, g.charge_start, g.charge_end"
    s_keys = ("l.currency, l.charge_start, l.charge_end, sg.kind, sg.reason"
              + "".join(f", sg.{g}" for g in gk))
    share = d.idiv(f"CAST(w.cost_units AS {units}) * w.w", "w.cap_ms")
    f_share = d.idiv(f"CAST(g.cost_units AS {units}) * sp.k_w", "st.w_total")
    f_keys = ("g.currency, g.charge_start, g.charge_end, sg.kind, sg.reason"
              + "".join(f", sg.{g}" for g in gk))
    x_keys = ("x.currency, x.charge_start, x.charge_end, x.kind, x.reason"
              + "".join(f", x.{g}" for g in gk))
    alloc = f"""
SELECT {a_keys},
       CAST(sum({share}) AS {units}) AS units,
       sum(w.w) AS gpu_ms
FROM weights w JOIN line_groups l ON w.line_id = l.line_id
GROUP BY {a_keys}
UNION ALL  -- lines with nothing measured to split them by: unallocated, with the reason
SELECT {u_keys_g}, 'unallocated', g.no_data_reason, {g_null}
       'unobserved', CAST(sum(g.cost_units) AS {units}), sum(g.billed_gpu_ms)
FROM gpu_lines g LEFT JOIN split_totals st ON {on_split('g', 'st')}
WHERE g.no_data_reason IS NOT NULL AND NOT {follower}
GROUP BY {u_keys_g}, g.no_data_reason
UNION ALL  -- lines the provider split (FOCUS 1.3 Allocated*): to what each names, whole;
           -- with the credits, refunds, adjustments on a resource and period it split
SELECT {x_keys}, '{PROVIDER_PHASE}', CAST(sum(x.units) AS {units}), sum(x.gpu_ms)
FROM (
  SELECT {s_keys}, CAST(l.cost_units AS {units}) AS units, l.billed_gpu_ms AS gpu_ms
  FROM gpu_lines l JOIN split_groups sg ON l.split_key = sg.split_key
  UNION ALL
  SELECT {f_keys}, {f_share} AS units, g.billed_gpu_ms AS gpu_ms
  FROM gpu_lines g JOIN split_totals st ON {on_split('g', 'st')}
  JOIN split_weights sp ON {on_split('g', 'sp')}
  JOIN split_groups sg ON sp.split_key = sg.split_key
  WHERE g.split_key IS NULL AND g.billed_gpu_ms = 0
) x
GROUP BY {x_keys}"""

    p_keys = "currency, charge_start, charge_end"
    period_totals = f"""
SELECT {p_keys}, CAST(sum(cost_units) AS {units}) AS units,
       sum(billed_gpu_ms) AS billed_gpu_ms
FROM gpu_lines GROUP BY {p_keys}"""
    return [("gpu_periods", gpu_periods), ("gpu_lines", gpu_lines),
            ("split_weights", split_weights),
            ("split_totals", split_totals), ("line_groups", line_groups), ("meas", meas),
            ("weights", weights), ("alloc", alloc), ("period_totals", period_totals)]



def script(n_keys: int, method: str, cost: str = "billed",
           window: tuple[str, str] | None = None, dialect: str = "duckdb") -> str:
    """The whole query as a script a data team runs: one ``CREATE TABLE name AS SELECT`` per
    derived relation, in order (DuckDB: temp tables, so it runs again in one session)."""
    create = "CREATE OR REPLACE TEMP TABLE" if dialect == "duckdb" else "CREATE TABLE"
    return "".join(f"\n{create} {name} AS{sql.rstrip()};\n"
                   for name, sql in relations(n_keys, method, cost, window, dialect))
