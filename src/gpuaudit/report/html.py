"""The HTML report: one self-contained page (inline CSS, SVG and a few lines of JS).

No CDN, no fonts, no network: the page's Content-Security-Policy forbids every fetch, and
the only script allowed is the one below, pinned by its SHA-256 hash, so even a label that
slipped past escaping could not run. Every string from the data (pod, team, GPU names,
evidence, ``extra`` sections) goes through :func:`html.escape`.

Nothing is computed here: the timeline and histogram come from
``result.extra["timeline"]`` (built by :mod:`gpuaudit.classify.timeline`), money from the
cost report and the plan; this module only maps numbers to pixels and text.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpuaudit import __version__
from gpuaudit.classify.usage import PHASE_LOWER_PCT, PHASES, PhaseTime
from gpuaudit.price.cost import CostLine
from gpuaudit.price.money import format_usd
from gpuaudit.result import AuditResult
from gpuaudit.units import duration

__all__ = ["render_html"]

PHASE_COLOR = {"idle": "#d64545", "underutilized": "#e3a21a", "productive": "#4caf6a",
               "compute_bound": "#1f6f43"}
PHASE_LABEL = {"idle": "idle (<10%)", "underutilized": "underutilized (10-70%)",
               "productive": "productive (70-90%)", "compute_bound": "compute-bound (>=90%)"}
UNOBSERVED_COLOR = "#c9ced6"
MAX_TIMELINE_GPUS = 32
MAX_TABLE_ROWS = 500
MAX_GENERIC_ROWS = 200
CHART_W = 640

_CSS = """
:root{--fg:#1d232b;--muted:#5d6875;--bg:#f5f6f8;--card:#fff;--line:#dde1e6;--accent:#2456a6}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
  color:var(--fg);background:var(--bg)}
main{max-width:1120px;margin:0 auto;padding:16px}
h1{font-size:1.6em;margin:.2em 0}h2{font-size:1.2em;margin:0 0 .6em}
h3{font-size:1em;margin:.8em 0 .3em}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px;
  margin:14px 0;overflow:hidden}
.meta{color:var(--muted);font-size:.9em;word-break:break-word}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:10px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:10px 12px}
.tile b{display:block;font-size:1.35em}.tile span{color:var(--muted);font-size:.85em}
.tile.bad b{color:#b3261e}.tile.good b{color:#1f6f43}
.bar{display:flex;height:22px;border-radius:4px;overflow:hidden;background:#eef0f3;
  min-width:60px}
.bar span{display:block;height:100%}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;margin:8px 0;font-size:.9em}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;
  vertical-align:-1px}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;width:100%;font-size:.9em}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
td.n,th.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.sortable th{cursor:pointer;user-select:none}
table.sortable th[aria-sort]::after{content:" \\2195";color:var(--muted)}
tr.wrong td{color:var(--muted);text-decoration:line-through}
.key{word-break:break-all;max-width:28em}
figure{margin:0}figcaption{color:var(--muted);font-size:.85em;margin-top:4px}
svg.chart{width:100%;height:auto;display:block}
svg.chart text{font:11px system-ui,sans-serif;fill:#333}
.rec{border-left:4px solid var(--accent);padding:6px 12px;margin:10px 0;background:#f8f9fb}
.rec.dim{border-left-color:#aab;opacity:.85}
.rec h3{margin:.2em 0}.rec p{margin:.25em 0}
.badge{display:inline-block;font-size:.75em;padding:1px 7px;border-radius:9px;
  background:#e6ecf6;color:#234;margin-left:6px}
details summary{cursor:pointer;color:var(--accent)}
table.kv th{width:30%;color:var(--muted);font-weight:600}
footer{color:var(--muted);font-size:.8em;text-align:center;margin:20px 0}
.demo{background:#fff4d6;border:2px solid #e3a21a;border-radius:8px;padding:8px 12px}
@media (max-width:640px){main{padding:8px}section{padding:10px;border-radius:8px}
  body{font-size:14px}h1{font-size:1.3em}.tile b{font-size:1.15em}
  svg.chart text{font-size:16px}}
@media print{section{break-inside:avoid}}
"""

# Sort any table.sortable by clicking a header: numbers by data-v, text otherwise.
_JS = """(function(){
document.querySelectorAll('table.sortable').forEach(function(t){
 var ths=t.querySelectorAll('thead th');
 ths.forEach(function(th,i){th.setAttribute('aria-sort','none');
  th.addEventListener('click',function(){
   var body=t.tBodies[0];var rows=Array.prototype.slice.call(body.rows);
   var asc=th.getAttribute('aria-sort')!=='ascending';
   ths.forEach(function(x){x.setAttribute('aria-sort','none');});
   th.setAttribute('aria-sort',asc?'ascending':'descending');
   rows.sort(function(a,b){var x=a.cells[i],y=b.cells[i];
    var vx=x.getAttribute('data-v'),vy=y.getAttribute('data-v');
    var r=(vx!==null&&vy!==null)?(parseFloat(vx)-parseFloat(vy))
      :x.textContent.localeCompare(y.textContent);return asc?r:-r;});
   rows.forEach(function(r){body.appendChild(r);});});});});
document.documentElement.setAttribute('data-ready','1');
})();"""
_JS_HASH = base64.b64encode(hashlib.sha256(_JS.encode("utf-8")).digest()).decode("ascii")
_CSP = (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        f"script-src 'sha256-{_JS_HASH}'; base-uri 'none'; form-action 'none'")


def esc(x: object) -> str:
    """Text for HTML and SVG, quotes included (attribute-safe)."""
    return html.escape("" if x is None else str(x), quote=True)


def usd(x: Decimal) -> str:
    return format_usd(x)


def _hours(s: float) -> str:
    """GPU time or a window at its scale (us, ms, s, h): :func:`gpuaudit.units.duration`."""
    return duration(s)


def _pct(x: float | Decimal) -> str:
    return f"{100 * float(x):.1f}%"


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{body}</section>'


# -- header and tiles ---------------------------------------------------------------------
def _header(result: AuditResult) -> str:
    u, c = result.usage, result.cost
    window = ""
    if u.window_start and u.window_end:
        window = (f"{u.window_start:%Y-%m-%d %H:%M:%S} to {u.window_end:%Y-%m-%d %H:%M:%S} UTC"
                  f" ({_hours(u.wall_s)})")
    rates = "; ".join(f"{r.gpu_model or k or 'GPU'}: {r.describe()}" for k, r in c.rates.items())
    demo = result.extra.get("demo")
    banner = (f'<p class="demo" role="alert" id="demo-notice"><b>{esc(demo["statement"])}</b>'
              "</p>" if isinstance(demo, Mapping) and demo.get("statement") else "")
    return (
        f"<header><h1>gpuaudit report</h1>{banner}"
        f'<p class="meta">source: {esc(u.source)}: {esc(u.origin)}<br>'
        f"window: {esc(window)}; {len(u.series)} GPU(s); sample interval {duration(u.interval_s)} "
        f"(gaps over {duration(u.cap_s)} count as unobserved)<br>price: {esc(rates)}"
        + "".join(f"<br>price row: {esc(r.choice)}" for r in c.rates.values() if r.choice)
        + "</p></header>"
    )


def _tiles(result: AuditResult) -> str:
    c, p = result.cost, result.plan
    t = c.total
    tc = t.in_cents()
    tiles = [
        ("", usd(tc.observed), "observed cost (the window)"),
        ("bad", usd(tc.waste), f"waste, {_pct(t.waste_share)} of cost"),
        ("", usd(c.cost_projection["monthly"]), "cost per month (720 h)"),
        ("bad", usd(p.monthly_waste_usd), "waste per month"),
        ("good", usd(p.monthly_savings_usd), f"savings per month ({_pct(p.total_fraction)})"),
        ("", f"{float(t.gpu_hours):,.2f}", "GPU-hours billed"),
    ]
    mu = t.time.mean_util_pct
    if mu is not None:
        tiles.append(("", f"{mu:.1f}%", "mean utilization (observed time)"))
    return '<div class="tiles">' + "".join(
        f'<div class="tile {cls}"><b>{esc(v)}</b><span>{esc(label)}</span></div>'
        for cls, v, label in tiles) + "</div>"


# -- phases -------------------------------------------------------------------------------
def _stacked(seconds: Mapping[str, float], shares: Mapping[str, int], title: str) -> str:
    spans = "".join(
        f'<span style="width:{shares[p]}%;background:{PHASE_COLOR[p]}" '
        f'title="{esc(PHASE_LABEL[p])}: {shares[p]}% ({esc(_hours(seconds[p]))})"></span>'
        for p in PHASES if shares[p] > 0)
    return f'<div class="bar" role="img" aria-label="{esc(title)}">{spans}</div>'


def _legend() -> str:
    items = "".join(f'<span><i style="background:{PHASE_COLOR[p]}"></i>{esc(PHASE_LABEL[p])}'
                    "</span>" for p in PHASES)
    items += f'<span><i style="background:{UNOBSERVED_COLOR}"></i>unobserved / no reading</span>'
    return f'<div class="legend">{items}</div>'


def _phases(result: AuditResult) -> str:
    c = result.cost
    t: PhaseTime = c.total.time
    shares = t.phase_shares_pct()
    tc = c.total.in_cents()
    rows = "".join(
        f'<tr><td><i style="display:inline-block;width:10px;height:10px;'
        f'background:{PHASE_COLOR[p]}"></i> {esc(PHASE_LABEL[p])}</td>'
        f'<td class="n">{esc(_hours(getattr(t, f"{p}_s")))}</td><td class="n">{shares[p]}%</td>'
        f'<td class="n">{usd(tc.phase[p])}</td></tr>' for p in PHASES)
    rows += (f'<tr><td>unobserved (not in shares)</td><td class="n">{esc(_hours(t.unobserved_s))}'
             f'</td><td class="n"></td><td class="n">{usd(tc.unobserved)}</td></tr>'
             f'<tr><th>total billed</th><th class="n">{esc(_hours(t.total_s))}</th><th></th>'
             f'<th class="n">{usd(tc.observed)}</th></tr>')
    out = [f'<figure id="chart-phases" data-chart="phases">'
           f'{_stacked(t.phase_seconds(), shares, "phase shares of observed time")}'
           f"{_legend()}</figure>",
           '<div class="scroll"><table><thead><tr><th>phase</th><th class="n">GPU time</th>'
           f'<th class="n">share</th><th class="n">cost</th></tr></thead><tbody>{rows}'
           "</tbody></table></div>"]
    if 0 < c.total.observed_cost < Decimal("0.005"):
        out.append(f'<p class="meta">The {esc(_hours(result.usage.wall_s))} window cost under '
                   "a cent; the rates per hour and the projections carry the figures.</p>")
    if t.has_sm_view:
        secs = t.sm_phase_seconds()
        sm_shares = t.sm_phase_shares_pct()
        out.append("<h3>SM-activity view (sm_active: a tiny kernel running nonstop reads 100% "
                   "utilization)</h3>" + _stacked(secs, sm_shares, "phase shares by SM activity"))
    per_gpu = c.per_gpu[:MAX_TIMELINE_GPUS]
    if len(c.per_gpu) > 1:
        bars = "".join(
            f'<tr><td class="key">{esc(ln.key[0])}</td><td style="width:55%">'
            f'{_stacked(ln.time.phase_seconds(), ln.time.phase_shares_pct(), str(ln.key[0]))}'
            f'</td><td class="n">{usd(ln.in_cents().observed)}</td></tr>' for ln in per_gpu)
        more = (f'<p class="meta">{len(c.per_gpu) - len(per_gpu)} more GPUs in the table '
                "below</p>" if len(c.per_gpu) > len(per_gpu) else "")
        out.append('<h3>Per GPU (most expensive first)</h3><div class="scroll">'
                   f"<table><tbody>{bars}</tbody></table></div>{more}")
    return _section("phases", "Where the GPU time went", "".join(out))


# -- timeline and histogram ---------------------------------------------------------------
def _fmt_time(start: datetime, offset_s: float) -> str:
    return f"{start + timedelta(seconds=offset_s):%H:%M:%S}"


def _timeline(tl: Mapping[str, Any]) -> str:
    gpus: Sequence[Mapping[str, Any]] = tl.get("gpus") or []
    n = int(tl.get("buckets") or 0)
    if not gpus or n <= 0:
        return ""
    shown = list(gpus[:MAX_TIMELINE_GPUS])
    label_h, band_h, gap = 14.0, 26.0, 8.0
    row_h = label_h + band_h + gap
    axis_h = 18.0
    height = row_h * len(shown) + axis_h
    bw = CHART_W / n
    parts = [f'<svg class="chart" viewBox="0 0 {CHART_W} {height:.0f}" role="img" '
             f'aria-label="utilization timeline per GPU" xmlns="http://www.w3.org/2000/svg">']
    for r, g in enumerate(shown):
        top = r * row_h
        y0 = top + label_h
        label = str(g.get("gpu_uuid"))
        if g.get("host"):
            label += f" ({g.get('host')})"
        parts.append(f'<text x="0" y="{top + 11:.1f}">{esc(label)}</text>')
        parts.append(f'<rect x="0" y="{y0:.1f}" width="{CHART_W}" height="{band_h}" '
                     f'fill="{UNOBSERVED_COLOR}"/>')
        phases = g.get("phase") or []
        utils = g.get("util_pct") or []
        for i in range(min(n, len(phases))):
            ph = phases[i]
            if ph is None or not 0 <= int(ph) < len(PHASES):
                continue
            name = PHASES[int(ph)]
            u = utils[i] if i < len(utils) else None
            parts.append(f'<rect x="{i * bw:.2f}" y="{y0:.1f}" width="{bw + 0.4:.2f}" '
                         f'height="{band_h}" fill="{PHASE_COLOR[name]}">'
                         f"<title>{esc(PHASE_LABEL[name])}, mean {u}%</title></rect>")
        for seg in _segments(utils[:n]):
            pts = " ".join(f"{(i + 0.5) * bw:.2f},{y0 + band_h * (1 - float(v) / 100):.1f}"
                           for i, v in seg)
            parts.append(f'<polyline points="{pts}" fill="none" stroke="#111" '
                         'stroke-width="1.2" stroke-linejoin="round"/>')
    start = _parse_time(tl.get("start"))
    bucket_s = float(tl.get("bucket_s") or 0)
    if start is not None:
        y = height - 4
        parts.append(f'<text x="0" y="{y:.0f}">{esc(_fmt_time(start, 0))}</text>')
        parts.append(f'<text x="{CHART_W / 2:.0f}" y="{y:.0f}" text-anchor="middle">'
                     f"{esc(_fmt_time(start, bucket_s * n / 2))}</text>")
        parts.append(f'<text x="{CHART_W}" y="{y:.0f}" text-anchor="end">'
                     f"{esc(_fmt_time(start, bucket_s * n))} UTC</text>")
    parts.append("</svg>")
    note = ""
    hidden = len(gpus) - len(shown) + int(tl.get("truncated_gpus") or 0)
    if hidden > 0:
        note = f" {hidden} more GPU(s) not drawn."
    cap = (f"Each band is one GPU; colour = the phase holding most of each {bucket_s:.3g} s "
           "bucket, line = mean utilization (0-100%), grey = no reading (unobserved, not "
           f"idle).{note}")
    return (f'<figure id="chart-timeline" data-chart="timeline">{"".join(parts)}'
            f"<figcaption>{esc(cap)}</figcaption></figure>{_legend()}")


def _segments(values: Sequence[Any]) -> list[list[tuple[int, float]]]:
    out: list[list[tuple[int, float]]] = []
    cur: list[tuple[int, float]] = []
    for i, v in enumerate(values):
        if v is None:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append((i, float(v)))
    if cur:
        out.append(cur)
    return out


def _parse_time(s: object) -> datetime | None:
    if not isinstance(s, str):
        return None
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


def _histogram(tl: Mapping[str, Any]) -> str:
    h = tl.get("histogram") or {}
    secs = [float(x) for x in h.get("seconds") or []]
    edges = [float(x) for x in h.get("edges_pct") or []]
    if not secs or len(edges) != len(secs) + 1 or max(secs) <= 0:
        return ""
    top = max(secs)
    w, hgt, pad_l, pad_b = CHART_W, 170.0, 46.0, 22.0
    plot_w, plot_h = w - pad_l, hgt - pad_b - 8
    bw = plot_w / len(secs)
    parts = [f'<svg class="chart" viewBox="0 0 {w} {hgt:.0f}" role="img" '
             'aria-label="utilization histogram" xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="{pad_l}" y1="{8 + plot_h}" x2="{w}" y2="{8 + plot_h}" stroke="#999"/>']
    for i, s in enumerate(secs):
        bh = plot_h * s / top
        lo = edges[i]
        name = PHASES[sum(lo >= e for e in PHASE_LOWER_PCT[1:])]
        parts.append(f'<rect x="{pad_l + i * bw + 1:.1f}" y="{8 + plot_h - bh:.1f}" '
                     f'width="{bw - 2:.1f}" height="{bh:.1f}" fill="{PHASE_COLOR[name]}">'
                     f"<title>{lo:g}-{edges[i + 1]:g}%: {esc(_hours(s))}</title></rect>")
    for x in (0, 25, 50, 75, 100):
        anchor = "start" if x == 0 else "end" if x == 100 else "middle"
        parts.append(f'<text x="{pad_l + plot_w * x / 100:.1f}" y="{hgt - 6:.0f}" '
                     f'text-anchor="{anchor}">{x}%</text>')
    parts.append(f'<text x="{pad_l - 4}" y="16" text-anchor="end">{esc(_hours(top))}</text>')
    parts.append(f'<text x="{pad_l - 4}" y="{8 + plot_h:.0f}" text-anchor="end">0</text>')
    parts.append("</svg>")
    return (f'<figure id="chart-histogram" data-chart="histogram">{"".join(parts)}'
            "<figcaption>Observed GPU time by utilization (5% bins, all GPUs).</figcaption>"
            "</figure>")


# -- the waterfall ------------------------------------------------------------------------
def _waterfall(result: AuditResult) -> str:
    p = result.plan
    total = p.monthly_cost_usd
    if total <= 0:
        return "<p>No cost was observed, so there is nothing to save.</p>"
    waste = p.monthly_waste_usd
    eff, rate, saved = p.efficiency_monthly_usd, p.rate_monthly_usd, p.monthly_savings_usd
    bars: list[tuple[str, Decimal, Decimal, str, str]] = [
        ("cost per month at the observed rate", Decimal(0), total, "#2456a6", usd(total)),
        ("waste: idle + unused share of underutilized", total - waste, total, "#d64545",
         f"-{usd(waste)}"),
    ]
    for r in p.recommendations:
        tag = "alone" if r.counted else "alone, not counted"
        bars.append((f"{r.remediation.title} ({tag})", total - r.monthly_usd, total,
                     "#8fb3e6" if r.counted else "#c5cad3", f"-{usd(r.monthly_usd)}"))
    bars += [
        ("efficiency fixes combined: 1 - prod(1 - f), capped by waste", total - eff, total,
         "#4caf6a", f"-{usd(eff)}"),
        ("rate levers on what is left", total - eff - rate, total - eff, "#7b5cc4",
         f"-{usd(rate)}"),
        ("total savings: 1 - (1 - F)(1 - D)", total - saved, total, "#1f6f43", f"-{usd(saved)}"),
        ("cost per month after the counted fixes", Decimal(0), p.monthly_after_usd, "#2456a6",
         usd(p.monthly_after_usd)),
    ]
    label_h, bar_h, gap = 14.0, 16.0, 8.0
    row_h = label_h + bar_h + gap
    height = row_h * len(bars) + 4
    scale = Decimal(CHART_W - 90) / total
    parts = [f'<svg class="chart" viewBox="0 0 {CHART_W} {height:.0f}" role="img" '
             'aria-label="cost waterfall" xmlns="http://www.w3.org/2000/svg">']
    for i, (label, lo, hi, color, value) in enumerate(bars):
        top = i * row_h
        x0 = float(max(lo, Decimal(0)) * scale)
        x1 = float(max(hi, Decimal(0)) * scale)
        parts.append(f'<text x="0" y="{top + 11:.1f}">{esc(label)}</text>')
        parts.append(f'<rect x="{x0:.1f}" y="{top + label_h:.1f}" width="{max(x1 - x0, 1.5):.1f}"'
                     f' height="{bar_h}" fill="{color}"><title>{esc(label)}: {esc(value)}'
                     "</title></rect>")
        parts.append(f'<text x="{x1 + 4:.1f}" y="{top + label_h + 12:.1f}">{esc(value)}</text>')
    parts.append("</svg>")
    cap = ("Each fix is drawn on its own; they overlap, so they are combined, never added: "
           f"adding them would claim {_pct(p.naive_sum_fraction)} (WRONG, double-counts). "
           f"Combined: efficiency {_pct(p.efficiency_fraction)} (capped by the measured waste "
           f"{_pct(p.waste_fraction)}), rate {_pct(p.rate_fraction)}, total "
           f"{_pct(p.total_fraction)}.")
    return (f'<figure id="chart-waterfall" data-chart="waterfall">{"".join(parts)}'
            f"<figcaption>{esc(cap)}</figcaption></figure>")


def _savings_table(result: AuditResult) -> str:
    p = result.plan
    rows = [
        ("measured waste (cap on efficiency savings)", p.waste_fraction,
         usd(p.monthly_waste_usd), ""),
        ("efficiency fixes, 1 - prod(1 - f), capped", p.efficiency_fraction,
         usd(p.efficiency_monthly_usd), ""),
        ("rate levers (best of spot / commitment)", p.rate_fraction, usd(p.rate_monthly_usd), ""),
        ("total: 1 - (1 - F)(1 - D)", p.total_fraction, usd(p.monthly_savings_usd), ""),
        ("naive sum (WRONG: double-counts overlapping fixes)", p.naive_sum_fraction, "",
         "wrong"),
    ]
    body = "".join(f'<tr class="{cls}"><td>{esc(a)}</td><td class="n">{_pct(f)}</td>'
                   f'<td class="n">{esc(m)}</td></tr>' for a, f, m, cls in rows)
    notes = "".join(f"<li>{esc(n)}</li>" for n in p.notes)
    return ('<div class="scroll"><table><thead><tr><th></th><th class="n">share of cost</th>'
            f'<th class="n">per month</th></tr></thead><tbody>{body}</tbody></table></div>'
            f'<p>Monthly cost {usd(p.monthly_cost_usd)} &rarr; {usd(p.monthly_after_usd)} after '
            f"the counted fixes.</p>" + (f"<ul>{notes}</ul>" if notes else ""))


# -- tables and recommendations -----------------------------------------------------------
def _num(v: float | Decimal, text: str) -> str:
    return f'<td class="n" data-v="{float(v):.6g}">{esc(text)}</td>'


def _breakdown(result: AuditResult) -> str:
    c = result.cost
    lines: Sequence[CostLine] = c.per_group if c.per_group else c.per_gpu
    keys = [k.removeprefix("label:") for k in c.group_keys] if c.per_group else ["gpu"]
    head = "".join(f"<th>{esc(k)}</th>" for k in keys)
    head += "".join(f'<th class="n">{h}</th>' for h in (
        "GPU-h", "mean util", "idle", "under", "prod", "bound")) + "<th>phases</th>"
    head += '<th class="n">cost</th><th class="n">waste</th><th class="n">waste share</th>'
    rows = []
    for ln in lines[:MAX_TABLE_ROWS]:
        sh = ln.time.phase_shares_pct()
        mu = ln.time.mean_util_pct
        cells = "".join(f'<td class="key">{esc("(none)" if k is None else k)}</td>'
                        for k in ln.key)
        cells += _num(ln.gpu_hours, f"{float(ln.gpu_hours):,.2f}")
        cells += _num(-1 if mu is None else mu, "-" if mu is None else f"{mu:.0f}%")
        cells += "".join(_num(sh[p], f"{sh[p]}%") for p in PHASES)
        cells += f'<td style="min-width:90px">{_stacked(ln.time.phase_seconds(), sh, "phases")}</td>'
        lc = ln.in_cents()
        cells += _num(lc.observed, usd(lc.observed)) + _num(lc.waste, usd(lc.waste))
        cells += _num(ln.waste_share, _pct(ln.waste_share))
        rows.append(f"<tr>{cells}</tr>")
    more = (f'<p class="meta">{len(lines) - MAX_TABLE_ROWS} more rows: use --format json for '
            "all.</p>" if len(lines) > MAX_TABLE_ROWS else "")
    title = f"By {', '.join(keys)} (most expensive first; click a header to sort)"
    return _section("breakdown", title,
                    f'<div class="scroll"><table class="sortable" id="breakdown-table"><thead>'
                    f"<tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>{more}")


def _recommendations(result: AuditResult) -> str:
    p = result.plan
    if not p.recommendations:
        recs = "<p>None: nothing in the measurements calls for a change.</p>"
    else:
        items = []
        for i, r in enumerate(p.recommendations, 1):
            rem = r.remediation
            counted = ("" if r.counted else
                       f" (not counted: {esc(r.why_not_counted or 'unverified')})")
            vocab = ", ".join(rem.vocabulary)
            pre = "".join(f"<li>{esc(x)}</li>" for x in rem.preconditions)
            scope = ", ".join(r.scope)
            items.append(
                f'<article class="rec{"" if r.counted else " dim"}" id="rec-{esc(r.id)}">'
                f"<h3>{i}. {esc(rem.title)}<span class=\"badge\">{esc(rem.lever)}</span>"
                f'<span class="badge">{esc(r.id)}</span></h3>'
                f"<p><b>saves {_pct(r.fraction)} = {usd(r.monthly_usd)}/month on its own"
                f"</b>{counted}</p>"
                f"<p><b>evidence:</b> {esc(r.evidence)}</p>"
                + (f"<p><b>applies to:</b> {esc(scope)}</p>" if scope else "")
                + f"<p><b>typical:</b> {esc(rem.savings_range)} (source: {esc(rem.source)})</p>"
                + (f"<p><b>how:</b> {esc(vocab)}</p>" if vocab else "")
                + (f"<details><summary>check first</summary><ul>{pre}</ul></details>"
                   if pre else "")
                + "</article>")
        recs = "".join(items)
    return _section("recommendations", "Recommendations", recs)


def _findings(result: AuditResult) -> str:
    u = result.usage
    items: list[str] = []
    for pat in u.patterns:
        items.append(f"<li><b>{esc(pat.kind)}</b> on <code>{esc(pat.gpu_uuid)}</code>: "
                     f"{esc(pat.evidence)}</li>")
    for j in u.job_patterns:
        if len(j.gpu_uuids) > 1:
            items.append(f"<li><b>{esc(j.kind)}</b> on job <code>{esc(j.job)}</code>: "
                         f"{esc(j.evidence)}</li>")
    for jd in result.job_diagnoses:
        if len(jd.gpu_uuids) > 1:
            items.append(f"<li><b>{esc(jd.kind)}</b> on job <code>{esc(jd.job)}</code>: "
                         f"{jd.with_kind} of {len(jd.gpu_uuids)} GPUs"
                         + (f"; fixes: {esc(', '.join(jd.fixes))}" if jd.fixes else "")
                         + "</li>")
    for d in result.diagnoses:
        items.append(f"<li><b>{esc(d.kind)}</b> ({esc(d.phase)}) on "
                     f"<code>{esc(d.gpu_uuid)}</code>: {esc(d.evidence)}"
                     + (f"; fixes: {esc(', '.join(d.fixes))}" if d.fixes else "")
                     + (f"; to decide: {esc(d.decides)}" if d.decides else "") + "</li>")
    health = "".join(f"<li><b>[{esc(h.severity)}] {esc(h.kind)}</b> on "
                     f"<code>{esc(h.gpu_uuid)}</code>: {esc(h.evidence)}</li>"
                     for h in result.health)
    out = ""
    if items:
        out += _section("patterns", "Patterns and diagnoses", f"<ul>{''.join(items)}</ul>")
    if health:
        out += _section("health", "Health", f"<ul>{health}</ul>")
    return out


def _notes(result: AuditResult) -> str:
    u = result.usage
    items = [f"<li>{esc(n.reason)} ({n.count:,} {'cell' if n.column else 'row'}s"
             + (f", first at {esc(n.where)}" if n.where else "") + ")</li>" for n in u.notes]
    items += [f"<li>event: {esc(e)}</li>" for e in u.events]
    return _section("notes", "Data notes", f"<ul>{''.join(items)}</ul>") if items else ""


# -- extra sections (fleet, trace, anything else): shown generically ------------------------
def _scalar(v: object) -> str:
    if isinstance(v, float):
        return esc(f"{v:,.6g}")
    if isinstance(v, bool) or v is None:
        return esc(json.dumps(v))
    return esc(v)


def generic_html(value: object, depth: int = 0) -> str:
    """Any JSON-able value as nested key/value tables (dicts), tables (lists of dicts) or text."""
    if depth > 4:
        return f"<code>{esc(json.dumps(value, default=str)[:2000])}</code>"
    if isinstance(value, Mapping):
        if not value:
            return "<i>(empty)</i>"
        rows = "".join(f"<tr><th>{esc(k)}</th><td>{generic_html(v, depth + 1)}</td></tr>"
                       for k, v in list(value.items())[:MAX_GENERIC_ROWS])
        return f'<div class="scroll"><table class="kv"><tbody>{rows}</tbody></table></div>'
    if isinstance(value, (list, tuple)):
        if not value:
            return "<i>(none)</i>"
        if all(isinstance(x, Mapping) for x in value):
            cols: list[str] = []
            for x in value[:MAX_GENERIC_ROWS]:
                for k in x:
                    if str(k) not in cols and len(cols) < 24:
                        cols.append(str(k))
            head = "".join(f"<th>{esc(k)}</th>" for k in cols)
            body = "".join(
                "<tr>" + "".join(f"<td>{generic_html(x.get(k), depth + 1)}</td>" for k in cols)
                + "</tr>" for x in value[:MAX_GENERIC_ROWS])
            more = (f'<p class="meta">{len(value) - MAX_GENERIC_ROWS} more rows</p>'
                    if len(value) > MAX_GENERIC_ROWS else "")
            return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
                    f"<tbody>{body}</tbody></table></div>{more}")
        shown = ", ".join(generic_html(x, depth + 1) for x in value[:100])
        return shown + (f" ... ({len(value) - 100} more)" if len(value) > 100 else "")
    return _scalar(value)


def _extras(result: AuditResult) -> str:
    out = []
    bill = result.extra.get("bill")
    if isinstance(bill, Mapping):
        from gpuaudit.report.bill import bill_html

        out.append(bill_html(bill))
    titles = {"fleet": "Fleet", "trace": "Profiler trace"}
    for key, title in titles.items():
        if key in result.extra and result.extra[key] is not None:
            out.append(_section(f"extra-{key}", title, generic_html(result.extra[key])))
    rest = {k: v for k, v in result.extra.items()
            if k not in titles and k not in ("timeline", "demo", "bill")}
    if rest:
        out.append(_section("extra-other", "More data", generic_html(rest)))
    return "".join(out)


def render_html(result: AuditResult) -> str:
    """The whole report as one HTML document (UTF-8 text), readable offline on any screen."""
    tl = result.extra.get("timeline")
    timeline = _timeline(tl) if isinstance(tl, Mapping) else ""
    hist = _histogram(tl) if isinstance(tl, Mapping) else ""
    if not timeline:
        timeline = ("<p>No timeline: the samples could not be read a second time (a live "
                    "stream). Audit a recording or file to see one.</p>")
    body = [
        _header(result),
        _tiles(result),
        _phases(result),
        _section("timeline", "Utilization over time", timeline),
        _section("histogram", "Utilization histogram", hist) if hist else "",
        _section("waterfall", "From cost to savings (per month)",
                 _waterfall(result) + _savings_table(result)),
        _breakdown(result),
        _recommendations(result),
        _findings(result),
        _extras(result),
        _notes(result),
    ]
    title = f"gpuaudit report: {result.usage.origin}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{esc(_CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head><body><main>"
        + "".join(body)
        + f"<footer>gpuaudit {esc(__version__)}: shares of observed time; unobserved time is "
        "billed, never called waste. Money rounded only for display.</footer>"
        f"</main><script>{_JS}</script></body></html>\n"
    )
