"""The join: GPU bill lines to the GPU time measured on the same node in the same hours.

Written as SQL over three relations, so the same query runs where big bills live (Athena,
Trino, BigQuery; docs/billing.md gives the dialect changes):

- ``bill_lines``: the canonical bill (``readers.py``);
- ``gpu_skus(sku_text, instance, gpu_model, gpus_per_instance, per_gpu)``: the GPU SKUs found
  in the catalog (``gpu_lines.py``);
- ``host_map(resource_id, host)``: which telemetry host a bill resource is;
- ``usage_hours(host, period_start, held, g_0 .. g_n, idle_ms, underutilized_ms,
  productive_ms, compute_bound_ms, unobserved_ms)``: measured GPU time per host, hour and
  group (classify's ``period:3600`` cells summed over the host's GPUs), in integer
  milliseconds.

Money is integer units of 1e-12 (``DECIMAL(38,12)`` scaled), so every allocation is an
integer product and an integer division: exact, portable, no float. Each GPU line's cost
is split over its node's capacity ``W = max(billed GPU-ms, measured GPU-ms)`` in the line's
charge period: measured time to the teams (method ``allocation``: every phase of the time a
team held; method ``usage``: the non-idle phases, a team's idle time going to ``idle``),
time held by nobody to ``idle``, and billed time without telemetry to ``unallocated``
(with its reason). Lines with nothing measured to split them by (outside the telemetry's
window, or on a node never measured) are summed per charge period and go to ``unallocated``
whole. The integer division leaves less than one unit (1e-12) per weight; the
reconciliation (``reconcile.py``) rounds each charge period against its exact billed total.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["METHODS", "UNITS_PER_USD", "allocation_sql"]

METHODS: tuple[str, ...] = ("allocation", "usage")
UNITS_PER_USD = 1_000_000_000_000  # 1e-12 USD: the scale of DECIMAL(38,12)
PHASE_COLS = ("idle", "underutilized", "productive", "compute_bound")
COST_COLUMNS = {"billed": "billed_cost", "effective": "effective_cost", "list": "list_cost"}


def _hours_expr() -> str:
    # Hours a usage line covers: its quantity when the unit is hours (or seconds), else the
    # charge period's length. Credits and refunds cover no hours (their cost still splits).
    return (
        "CASE WHEN b.charge_category <> 'Usage' OR b.billed_cost < 0 THEN 0 "
        "WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('hrs', 'hr', 'hours', 'hour', 'h') "
        "THEN b.quantity "
        "WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('seconds', 'second', 's') "
        "THEN b.quantity / 3600.0 "
        "ELSE epoch(b.charge_end) / 3600.0 - epoch(b.charge_start) / 3600.0 END")


def allocation_sql(n_keys: int, method: str, cost: str = "billed",
                   window: tuple[str, str] | None = None) -> str:
    """The query that creates ``gpu_lines``, ``alloc`` and ``period_totals`` (temp tables).

    ``window``: the telemetry's [start, end) as ISO timestamps; a charge period outside it
    is not covered (its cost is unallocated, reason ``outside telemetry``).
    """
    if method not in METHODS:
        raise ValueError(method)
    cost_col = COST_COLUMNS[cost]
    gk = [f"g_{i}" for i in range(n_keys)]
    g_sel = "".join(f"u.{g}, " for g in gk)
    g_null = "".join(f"CAST(NULL AS VARCHAR) AS {g}, " for g in gk)
    w_start, w_end = window or ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00Z")

    def ts(iso: str) -> str:
        return f"TIMESTAMPTZ '{iso}'"

    per_phase = []
    for p in PHASE_COLS:
        if method == "allocation":
            kind = "CASE WHEN m.held THEN 'team' ELSE 'idle' END"
        else:
            kind = ("CASE WHEN NOT m.held THEN 'idle' "
                    + ("WHEN TRUE THEN 'idle' " if p == "idle" else "")
                    + "ELSE 'team' END")
        reason = "CASE WHEN m.held THEN 'held' ELSE 'unheld' END"
        per_phase.append(
            f"SELECT m.line_id, {kind} AS kind, {reason} AS reason, "
            + "".join(f"m.{g}, " for g in gk)
            + f"'{p}' AS phase, m.{p}_ms AS w FROM meas m")
    return f"""
CREATE OR REPLACE TEMP TABLE gpu_lines AS
-- one row per resource and charge period inside the telemetry's window, lines outside it
-- summed per charge period, instance and pricing category (nothing to split them by)
SELECT currency, CASE WHEN no_data_reason = 'outside telemetry' THEN NULL ELSE resource_id
       END AS resource_id, host, charge_start, charge_end, pricing_category, instance,
       gpu_model, no_data_reason, sum(billed_cost) AS billed_cost,
       sum(effective_cost) AS effective_cost, sum(list_cost) AS list_cost,
       sum(billed_gpu_ms) AS billed_gpu_ms, sum(cost_units) AS cost_units, count(*) AS lines
FROM (
  SELECT b.currency, b.resource_id, b.charge_start, b.charge_end, b.pricing_category,
         b.billed_cost, b.effective_cost, b.list_cost, s.instance, s.gpu_model, h.host,
         CAST(round(({_hours_expr()})
                    * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END)
                    * 3600000) AS BIGINT) AS billed_gpu_ms,
         CAST(b.{cost_col} * {UNITS_PER_USD} AS HUGEINT) AS cost_units,
         CASE WHEN b.charge_end <= {ts(w_start)} OR b.charge_start >= {ts(w_end)}
              THEN 'outside telemetry'
              WHEN h.host IS NULL THEN 'no telemetry for this node'
              ELSE NULL END AS no_data_reason
  FROM bill_lines b JOIN gpu_skus s ON b.sku_text = s.sku_text
  LEFT JOIN host_map h ON b.resource_id = h.resource_id
) GROUP BY ALL;

-- lines on a measured node inside the telemetry's window: split by the measured time
CREATE OR REPLACE TEMP TABLE line_groups AS
SELECT row_number() OVER () AS line_id, l.*
FROM (
  SELECT currency, resource_id, host, charge_start, charge_end,
         sum(cost_units) AS cost_units, sum(billed_gpu_ms) AS billed_gpu_ms
  FROM gpu_lines WHERE no_data_reason IS NULL GROUP BY ALL
) l;

CREATE OR REPLACE TEMP TABLE meas AS
SELECT l.line_id, u.held, {g_sel}
       sum(u.idle_ms) AS idle_ms, sum(u.underutilized_ms) AS underutilized_ms,
       sum(u.productive_ms) AS productive_ms, sum(u.compute_bound_ms) AS compute_bound_ms,
       sum(u.unobserved_ms) AS unobserved_ms
FROM line_groups l JOIN usage_hours u
  ON u.host = l.host AND u.period_start >= l.charge_start AND u.period_start < l.charge_end
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE weights AS
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
  SELECT line_id, 'unallocated', no_data_reason, {g_null} 'unobserved', 1 FROM caps
  WHERE cap_ms = 0
)
SELECT p.*, c.cost_units, greatest(c.cap_ms, 1) AS cap_ms
FROM parts p JOIN caps c ON p.line_id = c.line_id WHERE p.w > 0;

CREATE OR REPLACE TEMP TABLE alloc AS
SELECT l.currency, l.charge_start, l.charge_end, w.kind, w.reason, {", ".join(f"w.{g}" for g in gk) + ", " if gk else ""}w.phase,
       sum(CAST(w.cost_units AS HUGEINT) * w.w // w.cap_ms) AS units,
       sum(w.w) AS gpu_ms
FROM weights w JOIN line_groups l ON w.line_id = l.line_id
GROUP BY ALL
UNION ALL  -- lines with nothing measured to split them by: unallocated, with the reason
SELECT currency, charge_start, charge_end, 'unallocated', no_data_reason, {g_null}
       'unobserved', sum(cost_units), sum(billed_gpu_ms)
FROM gpu_lines WHERE no_data_reason IS NOT NULL GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE period_totals AS
SELECT currency, charge_start, charge_end, sum(cost_units) AS units,
       sum(billed_gpu_ms) AS billed_gpu_ms
FROM gpu_lines GROUP BY ALL;
"""


def group_cols(keys: Sequence[str]) -> list[str]:
    return [f"g_{i}" for i in range(len(keys))]
