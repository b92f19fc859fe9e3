-- inputs (trino)
CREATE TABLE bill_lines (
  currency VARCHAR,
  resource_id VARCHAR,
  resource_name VARCHAR,
  sku_text VARCHAR,
  service VARCHAR,
  charge_category VARCHAR,
  pricing_category VARCHAR,
  charge_start TIMESTAMP(6) WITH TIME ZONE,
  charge_end TIMESTAMP(6) WITH TIME ZONE,
  quantity DECIMAL(26,12),
  unit VARCHAR,
  billed_cost DECIMAL(38,12),
  effective_cost DECIMAL(38,12),
  list_cost DECIMAL(38,12),
  line_role VARCHAR,
  allocated_resource_id VARCHAR,
  allocated_resource_name VARCHAR,
  allocated_tags VARCHAR
);

CREATE TABLE gpu_skus (
  sku_text VARCHAR,
  instance VARCHAR,
  gpu_model VARCHAR,
  gpus_per_instance BIGINT,
  per_gpu BOOLEAN
);

CREATE TABLE host_map (
  resource_id VARCHAR,
  host VARCHAR
);

CREATE TABLE usage_hours (
  host VARCHAR,
  period_start TIMESTAMP(6) WITH TIME ZONE,
  held BOOLEAN,
  g_0 VARCHAR,
  g_1 VARCHAR,
  idle_ms BIGINT,
  underutilized_ms BIGINT,
  productive_ms BIGINT,
  compute_bound_ms BIGINT,
  unobserved_ms BIGINT
);

CREATE TABLE split_groups (
  split_key VARCHAR,
  kind VARCHAR,
  reason VARCHAR,
  g_0 VARCHAR,
  g_1 VARCHAR
);

-- the join: method allocation, cost billed, window 2026-10-05T00:00:00Z .. 2026-10-05T06:00:00Z

CREATE TABLE gpu_periods AS
SELECT currency, charge_start, charge_end, pricing_category, instance, gpu_model, split_key, sum(billed_cost) AS billed_cost,
       sum(effective_cost) AS effective_cost, sum(list_cost) AS list_cost,
       sum(billed_gpu_ms) AS billed_gpu_ms, count(*) AS lines
FROM (
  SELECT b.currency, b.charge_start, b.charge_end, b.pricing_category,
         b.billed_cost, b.effective_cost, b.list_cost, s.instance, s.gpu_model,
         CASE WHEN b.charge_category <> 'Usage' OR b.billed_cost < 0 THEN 0 WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('hrs', 'hr', 'hours', 'hour', 'h') THEN CASE WHEN b.quantity = floor(b.quantity) AND abs(b.quantity) < 1000000 THEN CAST(b.quantity AS BIGINT) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 3600000 ELSE CAST(round(CAST(b.quantity AS DECIMAL(26,12)) * CAST((CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 3600000 AS DECIMAL(12,0))) AS BIGINT) END WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('seconds', 'second', 's') THEN CASE WHEN b.quantity = floor(b.quantity) AND abs(b.quantity) < 1000000 THEN CAST(b.quantity AS BIGINT) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 1000 ELSE CAST(round(CAST(b.quantity AS DECIMAL(26,12)) * CAST((CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 1000 AS DECIMAL(12,0))) AS BIGINT) END ELSE date_diff('millisecond', b.charge_start, b.charge_end) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) END AS billed_gpu_ms,
         CASE WHEN b.line_role = 'provider split' THEN (COALESCE(b.allocated_tags, '') || '|' || COALESCE(b.allocated_resource_name, b.allocated_resource_id, '')) END AS split_key
  FROM bill_lines b JOIN gpu_skus s ON b.sku_text = s.sku_text
  WHERE b.line_role IS NULL OR b.line_role NOT IN ('commitment purchase', 'unused commitment')
) x
GROUP BY currency, charge_start, charge_end, pricing_category, instance, gpu_model, split_key;

CREATE TABLE gpu_lines AS
SELECT currency, resource_id, host, charge_start, charge_end, pricing_category, instance, gpu_model, no_data_reason, split_key, sum(billed_cost) AS billed_cost,
       sum(effective_cost) AS effective_cost, sum(list_cost) AS list_cost,
       sum(billed_gpu_ms) AS billed_gpu_ms,
       CAST(sum(billed_cost) * 1000000000000 AS DECIMAL(38,0)) AS cost_units,
       count(*) AS lines
FROM (
  SELECT b.currency, b.resource_id, b.charge_start, b.charge_end, b.pricing_category,
         b.billed_cost, b.effective_cost, b.list_cost, s.instance, s.gpu_model, h.host,
         CASE WHEN b.charge_category <> 'Usage' OR b.billed_cost < 0 THEN 0 WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('hrs', 'hr', 'hours', 'hour', 'h') THEN CASE WHEN b.quantity = floor(b.quantity) AND abs(b.quantity) < 1000000 THEN CAST(b.quantity AS BIGINT) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 3600000 ELSE CAST(round(CAST(b.quantity AS DECIMAL(26,12)) * CAST((CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 3600000 AS DECIMAL(12,0))) AS BIGINT) END WHEN b.quantity IS NOT NULL AND lower(b.unit) IN ('seconds', 'second', 's') THEN CASE WHEN b.quantity = floor(b.quantity) AND abs(b.quantity) < 1000000 THEN CAST(b.quantity AS BIGINT) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 1000 ELSE CAST(round(CAST(b.quantity AS DECIMAL(26,12)) * CAST((CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) * 1000 AS DECIMAL(12,0))) AS BIGINT) END ELSE date_diff('millisecond', b.charge_start, b.charge_end) * (CASE WHEN s.per_gpu THEN 1 ELSE s.gpus_per_instance END) END AS billed_gpu_ms,
         CASE WHEN b.line_role = 'provider split' THEN NULL
              WHEN h.host IS NULL THEN 'no telemetry for this node'
              ELSE NULL END AS no_data_reason,
         CASE WHEN b.line_role = 'provider split' THEN (COALESCE(b.allocated_tags, '') || '|' || COALESCE(b.allocated_resource_name, b.allocated_resource_id, '')) END AS split_key
  FROM bill_lines b JOIN gpu_skus s ON b.sku_text = s.sku_text
  LEFT JOIN host_map h ON b.resource_id = h.resource_id
  WHERE (b.charge_end > TIMESTAMP '2026-10-05 00:00:00 UTC' OR b.charge_end IS NULL) AND (b.charge_start < TIMESTAMP '2026-10-05 06:00:00 UTC' OR b.charge_start IS NULL) AND (b.line_role IS NULL OR b.line_role NOT IN ('commitment purchase', 'unused commitment'))
) x
GROUP BY currency, resource_id, host, charge_start, charge_end, pricing_category, instance, gpu_model, no_data_reason, split_key
UNION ALL  -- the charge periods outside the window: their sums, without resource or host
SELECT b.currency, CAST(NULL AS VARCHAR), CAST(NULL AS VARCHAR), b.charge_start,
       b.charge_end, b.pricing_category, b.instance, b.gpu_model,
       CASE WHEN b.split_key IS NULL THEN 'outside telemetry' END, b.split_key,
       b.billed_cost, b.effective_cost, b.list_cost, b.billed_gpu_ms,
       CAST(b.billed_cost * 1000000000000 AS DECIMAL(38,0)), b.lines
FROM gpu_periods b WHERE (b.charge_end <= TIMESTAMP '2026-10-05 00:00:00 UTC' OR b.charge_start >= TIMESTAMP '2026-10-05 06:00:00 UTC');

CREATE TABLE split_weights AS
SELECT x.currency, x.resource_id, x.charge_start, x.charge_end, x.split_key,
       (CAST(x.k_units / 1000000 AS DECIMAL(38,0)) + CASE WHEN x.k_units >= 0 AND (x.k_units - CAST(x.k_units / 1000000 AS DECIMAL(38,0)) * 1000000) < 0 THEN -1 WHEN x.k_units >= 0 AND (x.k_units - CAST(x.k_units / 1000000 AS DECIMAL(38,0)) * 1000000) >= 1000000 THEN 1 WHEN x.k_units < 0 AND (x.k_units - CAST(x.k_units / 1000000 AS DECIMAL(38,0)) * 1000000) > 0 THEN 1 WHEN x.k_units < 0 AND (x.k_units - CAST(x.k_units / 1000000 AS DECIMAL(38,0)) * 1000000) <= -1000000 THEN -1 ELSE 0 END) AS k_w
FROM (SELECT currency, resource_id, charge_start, charge_end, split_key,
             sum(cost_units) AS k_units
      FROM gpu_lines WHERE split_key IS NOT NULL AND resource_id IS NOT NULL
      GROUP BY currency, resource_id, charge_start, charge_end, split_key) x;

CREATE TABLE split_totals AS
SELECT currency, resource_id, charge_start, charge_end, sum(k_w) AS w_total
FROM split_weights GROUP BY currency, resource_id, charge_start, charge_end
HAVING sum(k_w) > 0;

CREATE TABLE line_groups AS
SELECT row_number() OVER (ORDER BY currency, resource_id, host, charge_start, charge_end) AS line_id, l.*
FROM (
  SELECT g.currency, g.resource_id, g.host, g.charge_start, g.charge_end, sum(g.cost_units) AS cost_units, sum(g.billed_gpu_ms) AS billed_gpu_ms
  FROM gpu_lines g LEFT JOIN split_totals st ON g.currency = st.currency AND g.resource_id = st.resource_id AND g.charge_start = st.charge_start AND g.charge_end = st.charge_end
  WHERE g.no_data_reason IS NULL AND g.split_key IS NULL AND NOT (st.resource_id IS NOT NULL AND g.billed_gpu_ms = 0)
  GROUP BY g.currency, g.resource_id, g.host, g.charge_start, g.charge_end
) l;

CREATE TABLE meas AS
SELECT line_id, held, g_0, g_1,
       sum(idle_ms) AS idle_ms, sum(underutilized_ms) AS underutilized_ms,
       sum(productive_ms) AS productive_ms, sum(compute_bound_ms) AS compute_bound_ms,
       sum(unobserved_ms) AS unobserved_ms
FROM (
  SELECT l.line_id, u.held, u.g_0, u.g_1, u.idle_ms, u.underutilized_ms, u.productive_ms, u.compute_bound_ms, u.unobserved_ms
  FROM line_groups l JOIN usage_hours u
    ON u.host = l.host AND u.period_start = l.charge_start
  WHERE date_diff('millisecond', l.charge_start, l.charge_end) <= 3600000 AND MOD(date_diff('millisecond', TIMESTAMP '1970-01-01 00:00:00 UTC', l.charge_start), 3600000) = 0
  UNION ALL
  SELECT l.line_id, u.held, u.g_0, u.g_1, u.idle_ms, u.underutilized_ms, u.productive_ms, u.compute_bound_ms, u.unobserved_ms
  FROM line_groups l JOIN usage_hours u
    ON u.host = l.host AND u.period_start >= l.charge_start AND u.period_start < l.charge_end
  WHERE NOT (date_diff('millisecond', l.charge_start, l.charge_end) <= 3600000 AND MOD(date_diff('millisecond', TIMESTAMP '1970-01-01 00:00:00 UTC', l.charge_start), 3600000) = 0)
) x
GROUP BY line_id, held, g_0, g_1;

CREATE TABLE weights AS
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
  SELECT m.line_id, CASE WHEN m.held THEN 'team' ELSE 'idle' END AS kind, CASE WHEN m.held THEN 'held' ELSE 'unheld' END AS reason, m.g_0, m.g_1, 'idle' AS phase, m.idle_ms AS w FROM meas m UNION ALL SELECT m.line_id, CASE WHEN m.held THEN 'team' ELSE 'idle' END AS kind, CASE WHEN m.held THEN 'held' ELSE 'unheld' END AS reason, m.g_0, m.g_1, 'underutilized' AS phase, m.underutilized_ms AS w FROM meas m UNION ALL SELECT m.line_id, CASE WHEN m.held THEN 'team' ELSE 'idle' END AS kind, CASE WHEN m.held THEN 'held' ELSE 'unheld' END AS reason, m.g_0, m.g_1, 'productive' AS phase, m.productive_ms AS w FROM meas m UNION ALL SELECT m.line_id, CASE WHEN m.held THEN 'team' ELSE 'idle' END AS kind, CASE WHEN m.held THEN 'held' ELSE 'unheld' END AS reason, m.g_0, m.g_1, 'compute_bound' AS phase, m.compute_bound_ms AS w FROM meas m
  UNION ALL
  SELECT m.line_id, 'unallocated' AS kind, 'telemetry gap' AS reason, CAST(NULL AS VARCHAR) AS g_0, CAST(NULL AS VARCHAR) AS g_1, 
         'unobserved' AS phase, m.unobserved_ms AS w FROM meas m
  UNION ALL
  SELECT line_id, 'unallocated', no_data_reason, CAST(NULL AS VARCHAR) AS g_0, CAST(NULL AS VARCHAR) AS g_1,  'unobserved',
         cap_ms - measured_ms FROM caps
  UNION ALL  -- a line with no capacity at all (a credit on a node never measured)
  SELECT line_id, 'unallocated', no_data_reason, CAST(NULL AS VARCHAR) AS g_0, CAST(NULL AS VARCHAR) AS g_1,  'unobserved',
         CAST(1 AS BIGINT) FROM caps
  WHERE cap_ms = 0
)
SELECT p.*, c.cost_units, greatest(c.cap_ms, 1) AS cap_ms
FROM parts p JOIN caps c ON p.line_id = c.line_id WHERE p.w > 0;

CREATE TABLE alloc AS
SELECT l.currency, l.charge_start, l.charge_end, w.kind, w.reason, w.g_0, w.g_1, w.phase,
       CAST(sum((CAST(CAST(w.cost_units AS DECIMAL(38,0)) * w.w / w.cap_ms AS DECIMAL(38,0)) + CASE WHEN CAST(w.cost_units AS DECIMAL(38,0)) * w.w >= 0 AND (CAST(w.cost_units AS DECIMAL(38,0)) * w.w - CAST(CAST(w.cost_units AS DECIMAL(38,0)) * w.w / w.cap_ms AS DECIMAL(38,0)) * w.cap_ms) < 0 THEN -1 WHEN CAST(w.cost_units AS DECIMAL(38,0)) * w.w >= 0 AND (CAST(w.cost_units AS DECIMAL(38,0)) * w.w - CAST(CAST(w.cost_units AS DECIMAL(38,0)) * w.w / w.cap_ms AS DECIMAL(38,0)) * w.cap_ms) >= w.cap_ms THEN 1 WHEN CAST(w.cost_units AS DECIMAL(38,0)) * w.w < 0 AND (CAST(w.cost_units AS DECIMAL(38,0)) * w.w - CAST(CAST(w.cost_units AS DECIMAL(38,0)) * w.w / w.cap_ms AS DECIMAL(38,0)) * w.cap_ms) > 0 THEN 1 WHEN CAST(w.cost_units AS DECIMAL(38,0)) * w.w < 0 AND (CAST(w.cost_units AS DECIMAL(38,0)) * w.w - CAST(CAST(w.cost_units AS DECIMAL(38,0)) * w.w / w.cap_ms AS DECIMAL(38,0)) * w.cap_ms) <= -w.cap_ms THEN -1 ELSE 0 END)) AS DECIMAL(38,0)) AS units,
       sum(w.w) AS gpu_ms
FROM weights w JOIN line_groups l ON w.line_id = l.line_id
GROUP BY l.currency, l.charge_start, l.charge_end, w.kind, w.reason, w.g_0, w.g_1, w.phase
UNION ALL  -- lines with nothing measured to split them by: unallocated, with the reason
SELECT g.currency, g.charge_start, g.charge_end, 'unallocated', g.no_data_reason, CAST(NULL AS VARCHAR) AS g_0, CAST(NULL AS VARCHAR) AS g_1, 
       'unobserved', CAST(sum(g.cost_units) AS DECIMAL(38,0)), sum(g.billed_gpu_ms)
FROM gpu_lines g LEFT JOIN split_totals st ON g.currency = st.currency AND g.resource_id = st.resource_id AND g.charge_start = st.charge_start AND g.charge_end = st.charge_end
WHERE g.no_data_reason IS NOT NULL AND NOT (st.resource_id IS NOT NULL AND g.billed_gpu_ms = 0)
GROUP BY g.currency, g.charge_start, g.charge_end, g.no_data_reason
UNION ALL  -- lines the provider split (FOCUS 1.3 Allocated*): to what each names, whole;
           -- with the credits, refunds, adjustments on a resource and period it split
SELECT x.currency, x.charge_start, x.charge_end, x.kind, x.reason, x.g_0, x.g_1, 'provider_split', CAST(sum(x.units) AS DECIMAL(38,0)), sum(x.gpu_ms)
FROM (
  SELECT l.currency, l.charge_start, l.charge_end, sg.kind, sg.reason, sg.g_0, sg.g_1, CAST(l.cost_units AS DECIMAL(38,0)) AS units, l.billed_gpu_ms AS gpu_ms
  FROM gpu_lines l JOIN split_groups sg ON l.split_key = sg.split_key
  UNION ALL
  SELECT g.currency, g.charge_start, g.charge_end, sg.kind, sg.reason, sg.g_0, sg.g_1, (CAST(CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w / st.w_total AS DECIMAL(38,0)) + CASE WHEN CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w >= 0 AND (CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w - CAST(CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w / st.w_total AS DECIMAL(38,0)) * st.w_total) < 0 THEN -1 WHEN CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w >= 0 AND (CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w - CAST(CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w / st.w_total AS DECIMAL(38,0)) * st.w_total) >= st.w_total THEN 1 WHEN CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w < 0 AND (CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w - CAST(CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w / st.w_total AS DECIMAL(38,0)) * st.w_total) > 0 THEN 1 WHEN CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w < 0 AND (CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w - CAST(CAST(g.cost_units AS DECIMAL(38,0)) * sp.k_w / st.w_total AS DECIMAL(38,0)) * st.w_total) <= -st.w_total THEN -1 ELSE 0 END) AS units, g.billed_gpu_ms AS gpu_ms
  FROM gpu_lines g JOIN split_totals st ON g.currency = st.currency AND g.resource_id = st.resource_id AND g.charge_start = st.charge_start AND g.charge_end = st.charge_end
  JOIN split_weights sp ON g.currency = sp.currency AND g.resource_id = sp.resource_id AND g.charge_start = sp.charge_start AND g.charge_end = sp.charge_end
  JOIN split_groups sg ON sp.split_key = sg.split_key
  WHERE g.split_key IS NULL AND g.billed_gpu_ms = 0
) x
GROUP BY x.currency, x.charge_start, x.charge_end, x.kind, x.reason, x.g_0, x.g_1;

CREATE TABLE period_totals AS
SELECT currency, charge_start, charge_end, CAST(sum(cost_units) AS DECIMAL(38,0)) AS units,
       sum(billed_gpu_ms) AS billed_gpu_ms
FROM gpu_lines GROUP BY currency, charge_start, charge_end;
