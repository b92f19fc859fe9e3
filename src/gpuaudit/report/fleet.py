"""The fleet section of a report: showback per team/project/user, unallocated GPUs, fleet KPIs,
utilization histograms per job, the recommender's advice per team, and how much data moved.

Reads only ``AuditResult.extra["fleet"]`` (plain dicts, built by
:func:`gpuaudit.price.attribution.fleet_summary`); computes nothing. The JSON report carries
the same dict under ``extra.fleet``; the HTML renderer reads it from there too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from gpuaudit.price.money import format_usd

__all__ = ["render_fleet"]


def _fmt_group(g: Mapping[str, str]) -> str:
    return ", ".join(f"{v or '-'}" for v in g.values()) or "all"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> list[str]:
    if markdown:
        out = ["| " + " | ".join(headers) + " |",
               "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return out
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                     for i, (h, w) in enumerate(zip(headers, widths)))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))))
    return out


def _money(s: str) -> str:
    """A dollar string of the fleet dict (already to the cent, from the price stage)."""
    return format_usd(Decimal(s))


def render_fleet(fleet: Mapping[str, Any], fmt: str = "terminal") -> str:
    """The fleet section as text: ``terminal`` (plain, fixed width) or ``markdown``."""
    md = fmt == "markdown"

    def h(title: str) -> str:
        return f"\n## {title}\n" if md else f"\n{title}\n{'=' * len(title)}"

    out: list[str] = []
    keys = fleet.get("group_keys", [])
    out.append(h(f"Fleet showback by {', '.join(keys) or 'all'}"))
    rows = []
    for e in fleet.get("showback", []):
        ph = e["phase_pct"]
        rows.append([_fmt_group(e["group"]), f"{e['gpu_hours']:,.1f}",
                     f"{e['effective_gpu_hours']:,.1f}",
                     f"{ph['idle']}/{ph['underutilized']}/{ph['productive']}/"
                     f"{ph['compute_bound']}",
                     f"{e['unobserved_hours']:,.1f}", _money(e["cost_usd"]),
                     _money(e["waste_usd"]), f"{e['waste_pct']:.0f}%"])
    out += _table([", ".join(keys) or "group", "GPU-h", "effective GPU-h",
                   "idle/under/prod/cb %", "unobserved h", "cost", "waste", "waste %"], rows, md)
    un = fleet.get("unallocated", {})
    if un.get("gpu_hours"):
        out.append("")
        out.append(f"Unallocated (no pod held the GPU): {un['gpu_hours']:,.1f} GPU-h, "
                   f"{_money(un['cost_usd'])}, all of it billed to no team.")
    worst = [(e["group"], p) for e in fleet.get("showback", []) for p in e.get("worst_pods", [])]
    if worst:
        out.append(h("Worst pods (waste $)"))
        worst.sort(key=lambda gp: -float(gp[1]["waste_usd"]))
        out += _table(["group", "namespace/pod", "mean util", "cost", "waste"], [
            [_fmt_group(g), f"{p.get('namespace', '-')}/{p.get('pod', '-')}",
             "-" if p["mean_util_pct"] is None else f"{p['mean_util_pct']:.0f}%",
             _money(p["cost_usd"]), _money(p["waste_usd"])] for g, p in worst[:10]], md)
    k = fleet.get("kpis", {})
    out.append(h("Fleet KPIs"))
    uw = k.get("util_window_pct", {})
    util = ", ".join(f"last {w}: {'-' if v is None else f'{v:.1f}%'}" for w, v in uw.items())
    if util:
        out.append(f"Average utilization {util}")
    if "idle_gpu_hours_per_day" in k:
        out.append(f"Idle GPU-hours per day (mean): {k['idle_gpu_hours_per_day']:,.1f}; "
                   f"waste per day (mean): {_money(k['waste_usd_per_day'])}")
    days = k.get("days", [])
    if days:
        out.append("")
        out += _table(["day (UTC)", "GPU-h", "idle GPU-h", "mean util", "cost", "waste"], [
            [d["day_start"][:16], f"{d['gpu_hours']:,.1f}", f"{d['idle_gpu_hours']:,.1f}",
             "-" if d["mean_util_pct"] is None else f"{d['mean_util_pct']:.1f}%",
             _money(d["cost_usd"]), _money(d["waste_usd"])] for d in days], md)
    hist = fleet.get("histograms", {})
    jobs = hist.get("jobs", [])
    if jobs:
        edges = hist.get("edges_pct", [])
        out.append(h("Utilization histogram per job (% of observed time)"))
        out += _table(["namespace/pod", "observed h", *(f"{e}%" for e in edges)], [
            [f"{j.get('namespace', '-')}/{j.get('pod', '-')}", f"{j['observed_hours']:,.1f}",
             *(f"{j['bins_pct'][e]:.0f}" for e in edges)] for j in jobs], md)
    advice = [(e["group"], a) for e in fleet.get("showback", []) for a in e.get("advice", [])]
    if advice:
        out.append(h("Advice per group"))
        for g, a in advice:
            bullet = "- " if md else "  * "
            out.append(f"{bullet}{_fmt_group(g)}: {a['title']} (saves ~{_money(a['monthly_usd'])}"
                       f"/month; {a['evidence']})")
    tr = fleet.get("transfer", {})
    if tr:
        out.append("")
        out.append(f"Source: {tr.get('mode', '?')}; {tr.get('requests', 0)} request(s), "
                   f"{tr.get('wire_bytes', 0):,} bytes on the wire "
                   f"({tr.get('body_bytes', 0):,} decoded).")
    return "\n".join(out) + "\n"
