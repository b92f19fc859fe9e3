"""The terminal report (rich): what a person reads first after an audit."""

from __future__ import annotations

import io
from decimal import Decimal

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpuaudit.classify.usage import PHASES, PhaseTime
from gpuaudit.price.cost import CostLine
from gpuaudit.price.money import format_rate, format_usd
from gpuaudit.result import AuditResult
from gpuaudit.units import duration

__all__ = ["render_terminal"]

PHASE_LABEL = {"idle": "idle (<10%)", "underutilized": "underutilized (10-70%)",
               "productive": "productive (70-90%)", "compute_bound": "compute-bound (>=90%)"}
PHASE_STYLE = {"idle": "red", "underutilized": "yellow", "productive": "green",
               "compute_bound": "bright_green"}
MAX_ROWS = 20


def usd(x: Decimal) -> str:
    """An amount to the cent (the one money rule: :func:`gpuaudit.price.money.format_usd`)."""
    return format_usd(x)


def _bar(pct: float, width: int = 24) -> str:
    n = round(pct / 100 * width)
    return "█" * n + "·" * (width - n)


def _hours(s: float) -> str:
    """GPU time or a window at its scale (us, ms, s, h): :func:`gpuaudit.units.duration`."""
    return duration(s)


def _phase_table(t: PhaseTime, line: CostLine) -> Table:
    tab = Table(box=box.SIMPLE_HEAVY, title="Where the GPU time went", title_justify="left")
    tab.add_column("phase")
    tab.add_column("GPU time", justify="right")
    tab.add_column("share", justify="right")
    tab.add_column("", no_wrap=True)
    tab.add_column("cost", justify="right")
    shares = t.phase_shares_pct()
    cl = line.in_cents()
    for p in PHASES:
        tab.add_row(Text(PHASE_LABEL[p], style=PHASE_STYLE[p]), _hours(getattr(t, f"{p}_s")),
                    f"{shares[p]}%", Text(_bar(shares[p]), style=PHASE_STYLE[p]),
                    usd(cl.phase[p]))
    tab.add_row("unobserved (not in shares)", _hours(t.unobserved_s), "", "",
                usd(cl.unobserved))
    tab.add_row(Text("total billed", style="bold"), _hours(t.total_s), "", "",
                Text(usd(cl.observed), style="bold"))
    return tab


def _sm_view(t: PhaseTime) -> Table | None:
    if not t.has_sm_view:
        return None
    shares = t.sm_phase_shares_pct()
    tab = Table(box=box.SIMPLE, title="SM-activity view (sm_active; a tiny kernel running "
                "nonstop reads 100% utilization)", title_justify="left")
    tab.add_column("phase")
    tab.add_column("share by utilization", justify="right")
    tab.add_column("share by SM activity", justify="right")
    ushares = t.phase_shares_pct()
    for p in PHASES:
        tab.add_row(PHASE_LABEL[p], f"{ushares[p]}%", f"{shares[p]}%")
    return tab


def render_terminal(result: AuditResult, *, width: int = 100, color: bool = False) -> str:
    u, c = result.usage, result.cost
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                  highlight=False, emoji=False, markup=False)
    window = ""
    if u.window_start and u.window_end:
        window = (f"{u.window_start:%Y-%m-%d %H:%M:%S} -> {u.window_end:%Y-%m-%d %H:%M:%S} UTC "
                  f"({_hours(u.wall_s)})")
    rates = "; ".join(f"{r.gpu_model or k or 'GPU'}: {r.describe()}" for k, r in c.rates.items())
    head = Text.assemble(
        ("gpuaudit report\n", "bold"),
        (f"source: {u.source} - {u.origin}\n", ""),
        (f"window: {window}; {len(u.series)} GPU(s); sample interval {duration(u.interval_s)} "
         f"(gaps over {duration(u.cap_s)} count as unobserved)\n", ""),
        (f"price: {rates}", "dim"),
        *((f"\nprice row: {r.choice}", "dim") for r in c.rates.values() if r.choice),
    )
    demo = result.extra.get("demo")
    if isinstance(demo, dict) and demo.get("statement"):
        con.print(Panel(Text(str(demo["statement"]), style="bold yellow"), box=box.HEAVY))
    con.print(Panel(head, box=box.ROUNDED))
    t = c.total.time
    con.print(_phase_table(t, c.total))
    if 0 < c.total.observed_cost < Decimal("0.005"):
        con.print(f"  the {_hours(u.wall_s)} window cost under a cent; the rates per hour and "
                  "the projections below carry the figures")
    sm = _sm_view(t)
    if sm is not None:
        con.print(sm)
    _sparklines(con, result, width)
    cp, wp = c.cost_projection, c.waste_projection
    tc = c.total.in_cents()
    money = Table(box=box.SIMPLE, title="Cost", title_justify="left")
    money.add_column("")
    money.add_column("observed", justify="right")
    money.add_column("rate per hour", justify="right")
    money.add_column("per day", justify="right")
    money.add_column("per month (720 h)", justify="right")
    money.add_column("per year (8,760 h)", justify="right")
    money.add_row("cost", usd(tc.observed), format_rate(cp["hourly"], "h"), usd(cp["daily"]),
                  usd(cp["monthly"]), usd(cp["yearly"]))
    money.add_row(Text("waste", style="red"), usd(tc.waste), format_rate(wp["hourly"], "h"),
                  usd(wp["daily"]), usd(wp["monthly"]), usd(wp["yearly"]))
    con.print(money)
    eff = c.cost_per_effective_gpu_hour
    facts = [f"waste = idle {usd(tc.idle)} + unused share of underutilized "
             f"{usd(tc.underutilized_waste)} ({100 * c.total.waste_share:.1f}% of cost); "
             f"headroom in busy time {usd(tc.headroom)} (not waste)",
             f"GPU-hours {c.total.gpu_hours:.2f}, effective GPU-hours "
             f"{c.total.effective_gpu_hours:.2f}"
             + (f", cost per effective GPU-hour {format_rate(eff, 'GPU-h')}"
                if eff is not None else "")]
    for k, v in c.unit_costs_shown.items():
        facts.append(f"cost per {k.rstrip('s')}: {format_rate(v, k.rstrip('s'))} "
                     f"({c.counts[k]:,} {k})")
    if c.energy is not None:
        e = f"energy {c.energy.kwh:.3f} kWh ({c.energy.method})"
        if c.energy.cost is not None and c.energy.usd_per_kwh is not None:
            e += f", {usd(c.energy.cost)} at {format_rate(c.energy.usd_per_kwh, 'kWh')}"
        facts.append(e)
    for f in facts:
        con.print(f"  {f}")
    con.print()
    _cpu_lines(con, result)
    _rows_table(con, result)
    if u.patterns or result.diagnoses:
        con.print(Text("Patterns and diagnoses", style="bold"))
        kinds: dict[str, list[str]] = {}
        for pat in u.patterns:
            kinds.setdefault(pat.kind, []).append(pat.gpu_uuid)
        for kind, ids in kinds.items():
            ex = next(x for x in u.patterns if x.kind == kind)
            con.print(f"  {kind}: {len(ids)} GPU(s), e.g. {ids[0]}: {ex.evidence}")
        for j in u.job_patterns:
            if len(j.gpu_uuids) > 1:
                con.print(f"  job {j.job}: {j.shape} ({len(j.gpu_uuids)} GPUs)")
        for jd in result.job_diagnoses:
            if len(jd.gpu_uuids) > 1:
                con.print(f"  job {jd.job}: {jd.kind} on {jd.with_kind} of "
                          f"{len(jd.gpu_uuids)} GPUs"
                          + (f"; fixes: {', '.join(jd.fixes)}" if jd.fixes else ""))
        for gd in result.group_diagnoses[:MAX_ROWS]:
            name = ", ".join(f"{k}={v}" for k, v in zip(u.by, gd.key))
            con.print(f"  group {name}: {gd.kind} ({gd.share:.0%} of its GPU time, "
                      f"{len(gd.gpu_uuids)} GPU(s))"
                      + (f"; fixes: {', '.join(gd.fixes)}" if gd.fixes else ""))
        # one line per cause and stretch of the run, with the GPUs it names
        causes: dict[tuple[str, str, bool], list[str]] = {}
        for d in result.diagnoses:
            causes.setdefault((d.kind, d.phase, d.top), []).append(d.gpu_uuid)
        for (kind, phase, top), ids in list(causes.items())[:MAX_ROWS]:
            d = next(x for x in result.diagnoses
                     if (x.kind, x.phase, x.top) == (kind, phase, top))
            where = f"{len(ids)} GPU(s), e.g. {ids[0]}" if len(ids) > 1 else ids[0]
            con.print(f"  {kind} ({phase}) on {where}: {d.evidence}"
                      + (f"; fixes: {', '.join(d.fixes)}" if d.fixes else "")
                      + (f"; to decide: {d.decides}" if d.decides else ""))
        con.print()
    if result.health:
        con.print(Text("Health", style="bold"))
        for h in result.health[:MAX_ROWS]:
            con.print(f"  [{h.severity}] {h.kind} on {h.gpu_uuid}: {h.evidence}")
        con.print()
    _plan(con, result)
    trace = result.extra.get("trace")
    if trace:
        from gpuaudit.report.trace import render_trace_terminal

        con.print(Text(render_trace_terminal(trace)), end="")
    if u.notes or u.events:
        con.print(Text("Data notes", style="bold"))
        for n in u.notes:
            con.print(f"  {n.reason} ({n.count:,} {'cell' if n.column else 'row'}s"
                      + (f", first at {n.where}" if n.where else "") + ")")
        for ev in u.events:
            con.print(f"  event: {ev}")
    return buf.getvalue()


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _cpu_lines(con: Console, result: AuditResult) -> None:
    """The CPU beside each GPU where it was measured (percent of all the host's cores)."""
    rows = [s for s in result.usage.series
            if s.host_cpu_util_pct is not None or s.proc_cpu_util_pct is not None]
    if not rows:
        return
    con.print(Text("CPU beside the GPUs (percent of all the host's cores)", style="bold"))
    for s in rows[:MAX_ROWS]:
        line = f"  {s.gpu_uuid} on {s.host}:"
        if s.host_cpu_util_pct is not None:
            line += (f" host {_pct(s.host_cpu_util_pct)} busy"
                     f" ({_pct(s.host_cpu_util_pct_while_idle)} while this GPU idles,"
                     f" {_pct(s.host_cpu_util_pct_while_busy)} while it is busy)")
        if s.proc_cpu_util_pct is not None:
            line += (f"{';' if s.host_cpu_util_pct is not None else ''} workload's processes "
                     f"{_pct(s.proc_cpu_util_pct)}"
                     f" ({_pct(s.proc_cpu_util_pct_while_idle)} while idle)")
        con.print(line)
    if len(rows) > MAX_ROWS:
        con.print(f"  ... and {len(rows) - MAX_ROWS} more GPU(s) (JSON report: gpus[].cpu)")
    con.print()


SPARK = "▁▂▃▄▅▆▇█"


def _sparklines(con: Console, result: AuditResult, width: int) -> None:
    """Utilization over time per GPU, from extra["timeline"] (classify/timeline.py)."""
    from gpuaudit.classify.timeline import resample_mean

    tl = result.extra.get("timeline")
    if not isinstance(tl, dict) or not tl.get("gpus"):
        return
    gpus = tl["gpus"][:MAX_ROWS]
    name_w = min(28, max(len(str(g["gpu_uuid"])) for g in gpus))
    cols = max(10, width - name_w - 4)
    con.print(Text(f"Utilization over time (one line per GPU; blank = no reading; "
                   f"{tl.get('start', '')[:19]} UTC onwards)", style="bold"))
    for g in gpus:
        vals = resample_mean(g["util_pct"], cols)
        line = "".join(" " if v is None else SPARK[min(7, int(v / 100 * 8))] for v in vals)
        con.print(f"  {str(g['gpu_uuid'])[-name_w:]:>{name_w}} {line}", highlight=False)
    if len(tl["gpus"]) > MAX_ROWS:
        con.print(f"  ... {len(tl['gpus']) - MAX_ROWS} more GPUs")
    con.print()


def _rows_table(con: Console, result: AuditResult) -> None:
    c = result.cost
    rows = c.per_group if c.per_group else c.per_gpu
    keys = c.group_keys if c.per_group else ("gpu",)
    tab = Table(box=box.SIMPLE, title=f"By {', '.join(keys)} (most expensive first)",
                title_justify="left")
    for k in keys:
        tab.add_column(k)
    tab.add_column("GPU-h", justify="right")
    tab.add_column("mean util", justify="right")
    tab.add_column("idle", justify="right")
    tab.add_column("under", justify="right")
    tab.add_column("prod", justify="right")
    tab.add_column("bound", justify="right")
    tab.add_column("cost", justify="right")
    tab.add_column("waste", justify="right")
    for ln in rows[:MAX_ROWS]:
        sh = ln.time.phase_shares_pct()
        mu = ln.time.mean_util_pct
        lc = ln.in_cents()
        tab.add_row(*[str(k) if k is not None else "(none)" for k in ln.key],
                    f"{ln.gpu_hours:.2f}", "-" if mu is None else f"{mu:.0f}%",
                    *(f"{sh[ph]}%" for ph in PHASES), usd(lc.observed), usd(lc.waste))
    con.print(tab)
    if len(rows) > MAX_ROWS:
        con.print(f"  ... {len(rows) - MAX_ROWS} more (use --format json for all)")
    con.print()


def _plan(con: Console, result: AuditResult) -> None:
    p = result.plan
    con.print(Text("Recommendations", style="bold"))
    if not p.recommendations:
        con.print("  none: nothing in the measurements calls for a change")
    for i, r in enumerate(p.recommendations, 1):
        tag = "" if r.counted else " (not counted: " + (r.why_not_counted or "unverified") + ")"
        con.print(Text(f"  {i}. {r.remediation.title} [{r.id}, {r.remediation.lever}]", style="bold"
                       if r.counted else "dim"))
        con.print(f"     saves {100 * r.fraction:.1f}% = {usd(r.monthly_usd)}/month on its own"
                  f"{tag}")
        con.print(f"     evidence: {r.evidence}")
        con.print(f"     typical: {r.remediation.savings_range} (source: {r.remediation.source})")
        con.print(f"     check first: {'; '.join(r.remediation.preconditions)}")
    con.print()
    tab = Table(box=box.SIMPLE, title="Savings, combined honestly", title_justify="left")
    tab.add_column("")
    tab.add_column("share of cost", justify="right")
    tab.add_column("per month", justify="right")
    tab.add_row("measured waste (cap on efficiency savings)", f"{100 * p.waste_fraction:.1f}%",
                usd(p.monthly_waste_usd))
    tab.add_row("efficiency fixes, 1 - prod(1 - f), capped", f"{100 * p.efficiency_fraction:.1f}%",
                usd(p.efficiency_monthly_usd))
    tab.add_row("rate levers (best of spot / commitment)", f"{100 * p.rate_fraction:.1f}%", "")
    tab.add_row(Text("total: 1 - (1 - F)(1 - D)", style="bold"),
                f"{100 * p.total_fraction:.1f}%", Text(usd(p.monthly_savings_usd), style="bold"))
    tab.add_row(Text("naive sum (WRONG: double-counts overlapping fixes)", style="dim"),
                Text(f"{100 * p.naive_sum_fraction:.1f}%", style="dim"), "")
    con.print(tab)
    con.print(f"  monthly cost {usd(p.monthly_cost_usd)} -> {usd(p.monthly_after_usd)} after the "
              "counted fixes")
    for n in p.notes:
        con.print(f"  note: {n}")
    con.print()
