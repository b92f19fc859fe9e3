"""The bill section: the invoice split over teams by phase, reconciled to the cent.

Reads only ``extra["bill"]`` (plain dicts, money as strings, built by
:mod:`gpuaudit.price.billing.allocate`) and the showback table; computes nothing but the
widths of bars. Text (terminal, Markdown), an HTML section with a stacked bar per team by
phase, and the showback table as CSV or Parquet for the finance team.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from gpuaudit.price.billing.currency import digits
from gpuaudit.report.text_table import markdown_table, plain_table
from gpuaudit.validate import check_output_path

__all__ = ["bill_html", "render_bill", "render_compare", "showback_csv", "write_showback_parquet"]

PHASES = ("idle", "underutilized", "productive", "compute_bound", "unobserved",
          "provider_split")
PHASE_COLORS = {"idle": "#d62728", "underutilized": "#ff7f0e", "productive": "#2ca02c",
                "compute_bound": "#1f77b4", "unobserved": "#7f7f7f",
                "provider_split": "#9467bd"}


def _m(s: str | None, ccy: str) -> str:
    if s is None:
        return "-"
    v = Decimal(s)
    sign = "-" if v < 0 else ""
    sym = "$" if ccy == "USD" else f"{ccy} "
    # to the minor unit of its currency (JPY 0, USD 2, BHD 3)
    q = Decimal(1).scaleb(-digits(ccy))
    return f"{sign}{sym}{abs(v).quantize(q):,f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], md: bool) -> list[str]:
    return markdown_table(headers, rows) if md else plain_table(headers, rows)


def render_bill(bill: Mapping[str, Any], fmt: str = "terminal") -> str:
    """The bill section as text: ``terminal`` (plain, fixed width) or ``markdown``."""
    md = fmt == "markdown"

    def h(title: str) -> str:
        return f"\n## {title}\n" if md else f"\n{title}\n{'=' * len(title)}"

    out: list[str] = []
    out.append(h(f"Cloud bill split by {', '.join(bill['group_keys'])} "
                 f"(method: {bill['method']}, cost: {bill['cost_basis']})"))
    out.append(f"bill: {bill['dialect']}, {len(bill['files'])} file(s): "
               + ", ".join(bill["files"][:3]) + (" ..." if len(bill["files"]) > 3 else ""))
    tw = bill.get("telemetry_window")
    if tw:
        out.append(f"telemetry: {tw['start']} -> {tw['end']}")
    for note in bill.get("notes", []):
        out.append(f"note: {note}")
    for ccy, c in bill["currencies"].items():
        out.append(h(f"{ccy}: bill total {_m(c['bill_total'], ccy)} "
                     f"({c['bill_lines']} lines)"))
        g = c["gpu"]
        out.append(f"GPU lines: billed {_m(g['billed'], ccy)}, effective "
                   f"{_m(g['effective'], ccy)}, list {_m(g['list'], ccy)}, "
                   f"{g['gpu_hours']:,.1f} GPU-hours")
        out.append(f"non-GPU lines (shown apart, not split): {_m(c['non_gpu']['billed'], ccy)} "
                   f"in {c['non_gpu']['lines']} lines")
        rows = []
        # the provider-split column only where the provider split a line (FOCUS 1.3)
        shown = PHASES if any("provider_split" in ln["phases"] for ln in c["lines"]) \
            else PHASES[:-1]
        for ln in c["lines"]:
            ph = ln["phases"]
            rows.append([ln["line"], f"{ln['gpu_hours']:,.1f}", _m(ln["amount"], ccy)]
                        + [_m(ph.get(p), ccy) if p in ph else "" for p in shown])
        out.append("")
        out += _table(["line", "GPU-h", "amount", "idle", "underutil.", "productive",
                       "compute-bound", "no telemetry", "provider split"][:3 + len(shown)],
                      rows, md)
        r = c["reconciliation"]
        out.append("")
        out.append(f"reconciliation: lines {_m(r['sum_of_lines'], ccy)} = billed "
                   f"{_m(r['billed'], ccy)} (difference {_m(r['difference'], ccy)}; exact "
                   f"{r['exact_billed']}); {r['periods']} charge period(s), each exact to "
                   f"the cent: {'yes' if r['every_period_exact'] else 'NO'}")
        bk = c.get("buckets")
        if bk:
            out.append("")
            out.append(f"every line in one bucket ({bk['lines']} lines, {bk['gpu_lines']} of "
                       f"them GPU lines split over the first three; cost: {bk['cost_basis']}):")
            brows = [[name.replace("_", "-"), _m(v["amount"], ccy),
                      "" if v["lines"] is None else str(v["lines"]),
                      v.get("reason") or ""] for name, v in bk["buckets"].items()]
            brows.append(["= invoice", _m(bk["invoice_total"], ccy), str(bk["lines"]),
                          f"sum of buckets {_m(bk['sum_of_buckets'], ccy)}"])
            out += _table(["bucket", "amount", "lines", "note"], brows, md)
        if c["rates"]:
            out.append("")
            rrows = [[x["instance"], x["pricing_category"], f"{x['gpu_hours']:,.1f}",
                      _m(x["billed"], ccy), _m(x["effective"], ccy), _m(x["list"], ccy),
                      _m(x["effective_per_gpu_hour"], ccy), _m(x["list_per_gpu_hour"], ccy)]
                     for x in c["rates"]]
            out += _table(["instance", "pricing", "GPU-h", "billed", "effective", "list",
                           "eff./GPU-h", "list/GPU-h"], rrows, md)
        if c["non_gpu"]["by_service"]:
            out.append("")
            nrows = [[f"{x['service']} ({x['charge_category']})", str(x["lines"]),
                      _m(x["billed"], ccy)] for x in c["non_gpu"]["by_service"][:12]]
            out += _table(["non-GPU service", "lines", "billed"], nrows, md)
    ex = bill.get("audit_reconciliation")
    if ex:
        ccy = ex["currency"]
        out.append(h(f"Bill split vs audit ({ccy}): {_m(ex['bill_total'], ccy)} vs "
                     f"{_m(ex['audit_total'], ccy)}, difference {_m(ex['difference'], ccy)}"))
        out.append(ex["note"])
        xrows = [[x["gpu_model"], x["rate_source"],
                  "-" if x["rate_per_gpu_hour"] is None else _m(x["rate_per_gpu_hour"], ccy),
                  f"{x['bill_gpu_hours']:,.1f}", _m(x["bill_cost"], ccy),
                  f"{x['audit_gpu_hours']:,.1f}", _m(x["audit_cost"], ccy),
                  _m(x["difference"], ccy), x["why"]] for x in ex["rows"]]
        xrows.append(["total", "", "", "", _m(ex["bill_total"], ccy), "",
                      _m(ex["audit_total"], ccy), _m(ex["difference"], ccy), ""])
        out += _table(["GPU model", "rate from", "rate/GPU-h", "bill GPU-h",
                       f"bill ({ex['cost_basis']})", "audit GPU-h", "audit", "difference",
                       "why"], xrows, md)
    ps = (bill.get("provider_split") or {}).get("targets") or []
    if ps:
        out.append(h("Lines the provider split (FOCUS 1.3 Allocated*): each went to what it "
                     "names"))
        prow = [[x["resource_id"] or "-", x["allocated_resource_id"] or "-",
                 x["allocated_resource_name"] or "", x["allocated_tags"] or "",
                 str(x["lines"]), _m(x["amount"], x["currency"]), x["to"],
                 ",".join(str(i) for i in x["rows"][:6]) + (" ..." if len(x["rows"]) > 6
                                                            else "")] for x in ps]
        out += _table(["resource", "allocated to", "name", "tags", "lines", "amount",
                       "line of the split", "rows"], prow, md)
    miss = bill.get("bill_without_telemetry", [])
    if miss:
        out.append(h("Billed GPU nodes with no telemetry (unallocated)"))
        out += _table(["resource", "instance", "billed", "GPU-h"],
                      [[str(x["resource_id"]), str(x["instance"]),
                        _m(x["billed"], x["currency"]), f"{x['billed_gpu_hours']:,.1f}"]
                       for x in miss[:20]], md)
    extra = bill.get("telemetry_without_bill", [])
    if extra:
        out.append(h("Measured nodes with no bill line"))
        out.append(", ".join(extra[:50]) + (" ..." if len(extra) > 50 else ""))
    b = bill.get("budgets")
    if b:
        out.append(h(f"Budgets for {b['month']} (as of {b['as_of']})"))
        out += _table(["team", "budget", "month to date", "forecast", "interval", "status"],
                      [[x["team"], _m(x["budget"], b["currency"]),
                        _m(x["month_to_date"], b["currency"]),
                        _m(x["forecast"], b["currency"]),
                        f"{_m(x['forecast_low'], b['currency'])}.."
                        f"{_m(x['forecast_high'], b['currency'])}", x["status"]]
                       for x in b["teams"]], md)
        for a in b.get("alerts", []):
            out.append(f"ALERT: {a}")
    return "\n".join(out) + "\n"


def render_compare(cmp: Mapping[str, Any], fmt: str = "terminal") -> str:
    """``gpuaudit bill compare``: per team and per remediation, last vs this month."""
    md = fmt == "markdown"
    out = [f"Realised savings: {cmp['last']['name']} ({cmp['last']['hours']:,.1f} h) -> "
           f"{cmp['this']['name']} ({cmp['this']['hours']:,.1f} h), per month of 720 h", ""]
    out += _table(["line", "last/month", "this/month", "realised", "idle last", "idle this",
                   "idle realised"],
                  [[x["line"], _m(x["last_monthly"], x["currency"]),
                    _m(x["this_monthly"], x["currency"]),
                    _m(x["realised_monthly"], x["currency"]),
                    _m(x["idle_last_monthly"], x["currency"]),
                    _m(x["idle_this_monthly"], x["currency"]),
                    _m(x["idle_realised_monthly"], x["currency"])] for x in cmp["teams"]], md)
    out.append("")
    out += _table(["remediation", "projected then", "still projected", "taken", "status"],
                  [[x["id"], _m(x["projected_last_monthly"], "USD"),
                    _m(x["projected_this_monthly"], "USD"), _m(x["taken_monthly"], "USD"),
                    x["status"]] for x in cmp["remediations"]], md)
    out.append("")
    out.append(cmp["note"])
    return "\n".join(out) + "\n"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def bill_html(bill: Mapping[str, Any]) -> str:
    """The bill as an HTML section: per currency, a stacked bar per line by phase, the
    reconciliation and the rate table. Self-contained (inline styles, no script)."""
    parts = ['<section id="bill"><h2>Cloud bill split by '
             + _e(", ".join(bill["group_keys"])) + f" (method {_e(bill['method'])}, cost "
             f"{_e(bill['cost_basis'])})</h2>"]
    parts.append('<p class="meta">' + _e(bill["dialect"]) + ": " + _e(", ".join(
        bill["files"][:3])) + "</p>")
    legend = "".join(f'<span style="display:inline-block;margin-right:1em">'
                     f'<span style="display:inline-block;width:12px;height:12px;'
                     f'background:{PHASE_COLORS[p]}"></span> {_e(p.replace("_", "-"))}</span>'
                     for p in PHASES)
    for ccy, c in bill["currencies"].items():
        parts.append(f'<h3>{_e(ccy)}: GPU lines billed {_e(_m(c["gpu"]["billed"], ccy))} of '
                     f'{_e(_m(c["bill_total"], ccy))}</h3><p>{legend}</p>')
        top = max((abs(Decimal(ln["amount"])) for ln in c["lines"]), default=Decimal(0))
        rows = []
        for ln in c["lines"]:
            segs = []
            for p in PHASES:
                v = Decimal(ln["phases"].get(p, "0"))
                if v <= 0 or top <= 0:
                    continue
                w = float(v / top) * 100.0
                segs.append(f'<div class="seg" data-phase="{p}" title="{_e(p)} '
                            f'{_e(_m(str(v), ccy))}" style="width:{w:.3f}%;height:100%;'
                            f'background:{PHASE_COLORS[p]}"></div>')
            rows.append(
                f'<tr class="bill-line" data-kind="{_e(ln["kind"])}"><th>{_e(ln["line"])}</th>'
                f'<td style="width:55%"><div class="bar" style="display:flex;height:18px;'
                f'width:100%;background:#f4f4f4">{"".join(segs)}</div></td>'
                f'<td class="num">{_e(_m(ln["amount"], ccy))}</td>'
                f'<td class="num">{ln["gpu_hours"]:,.1f} GPU-h</td></tr>')
        parts.append(f'<figure id="chart-bill-{_e(ccy)}" data-chart="bill">'
                     '<div class="scroll"><table class="bill-bars"><thead><tr><th>line</th>'
                     '<th>by phase</th><th>amount</th><th>GPU-hours</th></tr></thead><tbody>'
                     + "".join(rows) + "</tbody></table></div></figure>")
        r = c["reconciliation"]
        parts.append(f'<p class="reconciliation">Lines {_e(_m(r["sum_of_lines"], ccy))} = '
                     f'billed {_e(_m(r["billed"], ccy))} (difference '
                     f'{_e(_m(r["difference"], ccy))}); {r["periods"]} charge periods, each '
                     f'exact to the cent: {"yes" if r["every_period_exact"] else "NO"}.</p>')
        bk = c.get("buckets")
        if bk:
            br = "".join(f"<tr><td>{_e(k.replace('_', '-'))}</td><td class=num>"
                         f"{_e(_m(v['amount'], ccy))}</td><td class=num>"
                         f"{'' if v['lines'] is None else v['lines']}</td></tr>"
                         for k, v in bk["buckets"].items())
            parts.append('<div class="scroll"><table class="bill-buckets"><thead><tr><th>'
                         "bucket</th><th>amount</th><th>lines</th></tr></thead><tbody>"
                         f"{br}<tr><th>invoice</th><th class=num>"
                         f"{_e(_m(bk['invoice_total'], ccy))}</th><th class=num>"
                         f"{bk['lines']}</th></tr></tbody></table></div>")
        if c["rates"]:
            rr = "".join(
                f"<tr><td>{_e(x['instance'])}</td><td>{_e(x['pricing_category'])}</td>"
                f"<td class=num>{x['gpu_hours']:,.1f}</td>"
                f"<td class=num>{_e(_m(x['billed'], ccy))}</td>"
                f"<td class=num>{_e(_m(x['effective'], ccy))}</td>"
                f"<td class=num>{_e(_m(x['list'], ccy))}</td>"
                f"<td class=num>{_e(_m(x['effective_per_gpu_hour'], ccy))}</td></tr>"
                for x in c["rates"])
            parts.append('<div class="scroll"><table><thead><tr><th>instance</th><th>pricing'
                         "</th><th>GPU-h</th><th>billed</th><th>effective</th><th>list</th>"
                         f"<th>effective/GPU-h</th></tr></thead><tbody>{rr}</tbody></table>"
                         "</div>")
    ex = bill.get("audit_reconciliation")
    if ex:
        xr = "".join(f"<tr><td>{_e(x['gpu_model'])}</td><td>{_e(x['rate_source'])}</td>"
                     f"<td class=num>{x['bill_gpu_hours']:,.1f}</td><td class=num>"
                     f"{_e(_m(x['bill_cost'], ex['currency']))}</td><td class=num>"
                     f"{x['audit_gpu_hours']:,.1f}</td><td class=num>"
                     f"{_e(_m(x['audit_cost'], ex['currency']))}</td><td class=num>"
                     f"{_e(_m(x['difference'], ex['currency']))}</td><td>{_e(x['why'])}</td>"
                     "</tr>" for x in ex["rows"])
        parts.append(f"<h3>Bill split vs audit: {_e(_m(ex['bill_total'], ex['currency']))} vs "
                     f"{_e(_m(ex['audit_total'], ex['currency']))}</h3><p>{_e(ex['note'])}</p>"
                     '<div class="scroll"><table class="bill-vs-audit"><thead><tr><th>GPU '
                     "model</th><th>rate from</th><th>bill GPU-h</th><th>bill</th><th>audit "
                     "GPU-h</th><th>audit</th><th>difference</th><th>why</th></tr></thead>"
                     f"<tbody>{xr}</tbody></table></div>")
    ps = (bill.get("provider_split") or {}).get("targets") or []
    if ps:
        pr = "".join(f"<tr><td>{_e(x['resource_id'] or '-')}</td>"
                     f"<td>{_e(x['allocated_resource_id'] or '-')}</td>"
                     f"<td>{_e(x['allocated_resource_name'] or '')}</td>"
                     f"<td>{_e(x['allocated_tags'] or '')}</td><td class=num>{x['lines']}"
                     f"</td><td class=num>{_e(_m(x['amount'], x['currency']))}</td>"
                     f"<td>{_e(x['to'])}</td></tr>" for x in ps)
        parts.append("<h3>Lines the provider split (FOCUS 1.3 Allocated*)</h3>"
                     '<div class="scroll"><table class="bill-provider-split"><thead><tr>'
                     "<th>resource</th><th>allocated to</th><th>name</th><th>tags</th>"
                     "<th>lines</th><th>amount</th><th>line of the split</th></tr></thead>"
                     f"<tbody>{pr}</tbody></table></div>")
    b = bill.get("budgets")
    if b:
        br = "".join(f"<tr><td>{_e(x['team'])}</td><td class=num>"
                     f"{_e(_m(x['budget'], b['currency']))}</td><td class=num>"
                     f"{_e(_m(x['month_to_date'], b['currency']))}</td><td class=num>"
                     f"{_e(_m(x['forecast'], b['currency']))}</td><td>{_e(x['status'])}</td>"
                     "</tr>" for x in b["teams"])
        parts.append(f"<h3>Budgets {_e(b['month'])}</h3><div class=\"scroll\"><table><thead>"
                     "<tr><th>team</th><th>budget</th><th>month to date</th><th>forecast</th>"
                     f"<th>status</th></tr></thead><tbody>{br}</tbody></table></div>")
    parts.append("</section>")
    return "".join(parts)


def showback_csv(table: pa.Table) -> str:
    """The showback table as CSV: amounts in currency units with two decimals."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    names = table.column_names
    w.writerow(names)
    cols = [table.column(n).to_pylist() for n in names]
    amt = names.index("amount")
    minor = cols[names.index("minor_units")] if "minor_units" in names else None
    for i in range(table.num_rows):
        row: list[Any] = []
        for j, col in enumerate(cols):
            v = col[i]
            if j == amt:
                d = 2 if minor is None else int(minor[i])
                v = str(Decimal(int(v)).scaleb(-d).quantize(Decimal(1).scaleb(-d)))
            elif hasattr(v, "isoformat"):
                v = v.isoformat().replace("+00:00", "Z")
            elif isinstance(v, float):
                v = f"{v:.6g}"
            row.append("" if v is None else v)
        w.writerow(row)
    return buf.getvalue()


def write_showback_parquet(table: pa.Table, path: Path) -> None:
    """The showback table as Parquet, ``amount`` as decimal(18, 2) (decimal(18, s) with s the
    largest minor unit of its currencies where one has more than 2 digits, e.g. BHD 3)."""
    import pyarrow.parquet as pq

    i = table.column_names.index("amount")
    minor = (table.column("minor_units").to_pylist() if "minor_units" in table.column_names
             else [2] * table.num_rows)
    scale = max([2, *(int(d) for d in minor)])
    amounts = pa.array([None if c is None else Decimal(int(c)).scaleb(-int(d))
                        for c, d in zip(table.column("amount").to_pylist(), minor)],
                       pa.decimal128(18, scale))
    out = table.set_column(i, "amount", amounts)
    check_output_path(path, "--output")
    pq.write_table(out, path)
