"""The Markdown report: for pull requests, wikis and tickets."""

from __future__ import annotations

from decimal import Decimal

from gpuaudit.classify.usage import PHASES
from gpuaudit.price.money import format_rate
from gpuaudit.report.terminal import PHASE_LABEL, usd
from gpuaudit.result import AuditResult
from gpuaudit.units import duration

__all__ = ["render_markdown"]


def _esc(text: object) -> str:
    """Escape what would break a Markdown table cell or inject markup."""
    s = str(text)
    for ch in ("\\", "|", "<", ">", "*", "_", "`", "[", "]"):
        s = s.replace(ch, "\\" + ch)
    return s.replace("\n", " ")


def render_markdown(result: AuditResult) -> str:
    u, c, p = result.usage, result.cost, result.plan
    cp, wp = c.cost_projection, c.waste_projection
    t = c.total.time
    out = ["# gpuaudit report", ""]
    demo = result.extra.get("demo")
    if isinstance(demo, dict) and demo.get("statement"):
        out += [f"> **{_esc(demo['statement'])}**", ""]
    out.append(f"- **source**: {_esc(u.source)}: {_esc(u.origin)}")
    if u.window_start and u.window_end:
        out.append(f"- **window**: {u.window_start:%Y-%m-%d %H:%M:%S} to "
                   f"{u.window_end:%Y-%m-%d %H:%M:%S} UTC ({duration(u.wall_s)}), "
                   f"{len(u.series)} GPU(s), interval {duration(u.interval_s)}")
    for k, rate in c.rates.items():
        out.append(f"- **price** ({_esc(rate.gpu_model or k or 'GPU')}): {_esc(rate.describe())}")
        if rate.choice:
            out.append(f"- **price row**: {_esc(rate.choice)}")
    out += ["", "## Where the GPU time went", "",
            "| phase | GPU time | share | cost |", "|---|---:|---:|---:|"]
    shares = t.phase_shares_pct()
    tc = c.total.in_cents()
    for ph in PHASES:
        out.append(f"| {PHASE_LABEL[ph]} | {duration(getattr(t, f'{ph}_s'))} | {shares[ph]}% "
                   f"| {usd(tc.phase[ph])} |")
    out.append(f"| unobserved | {duration(t.unobserved_s)} | | {usd(tc.unobserved)} |")
    out.append(f"| **total** | {duration(t.total_s)} | 100% | **{usd(tc.observed)}** |")
    if 0 < c.total.observed_cost < Decimal("0.005"):
        out += ["", f"The {duration(u.wall_s)} window cost under a cent; the rates per hour and "
                "the projections below carry the figures."]
    out += ["", "## Cost", "",
            "| | observed | rate per hour | daily | monthly (720 h) | yearly (8,760 h) |",
            "|---|---:|---:|---:|---:|---:|",
            f"| cost | {usd(tc.observed)} | {format_rate(cp['hourly'], 'h')} | "
            f"{usd(cp['daily'])} | {usd(cp['monthly'])} | {usd(cp['yearly'])} |",
            f"| waste | {usd(tc.waste)} | {format_rate(wp['hourly'], 'h')} | "
            f"{usd(wp['daily'])} | {usd(wp['monthly'])} | {usd(wp['yearly'])} |", "",
            f"Waste = idle {usd(tc.idle)} + unused share of underutilized "
            f"{usd(tc.underutilized_waste)}; headroom in busy time {usd(tc.headroom)} "
            "(not waste).", ""]
    rows = c.per_group if c.per_group else c.per_gpu
    keys = c.group_keys if c.per_group else ("gpu",)
    out += [f"## By {', '.join(keys)}", "",
            "| " + " | ".join(keys) + " | GPU-h | idle | under | prod | bound | cost | waste |",
            "|" + "---|" * len(keys) + "---:|---:|---:|---:|---:|---:|---:|"]
    for ln in rows:
        sh = ln.time.phase_shares_pct()
        lc = ln.in_cents()
        out.append("| " + " | ".join(_esc("(none)" if k is None else k) for k in ln.key)
                   + f" | {ln.gpu_hours:.2f} | " + " | ".join(f"{sh[ph]}%" for ph in PHASES)
                   + f" | {usd(lc.observed)} | {usd(lc.waste)} |")
    if u.patterns:
        out += ["", "## Patterns", ""]
        out += [f"- `{_esc(x.gpu_uuid)}`: **{x.kind}**: {_esc(x.evidence)}" for x in u.patterns]
    if u.job_patterns:
        out += [f"- job `{_esc(j.job)}`: **{j.kind}**: {_esc(j.evidence)}"
                for j in u.job_patterns if len(j.gpu_uuids) > 1]
    if result.diagnoses:
        out += ["", "## Diagnoses", ""]
        out += [f"- job `{_esc(j.job)}`: **{j.kind}** on {j.with_kind} of {len(j.gpu_uuids)} "
                "GPUs" + (f"; fixes: {', '.join(j.fixes)}" if j.fixes else "")
                for j in result.job_diagnoses if len(j.gpu_uuids) > 1]
        out += [f"- group `{_esc(', '.join(f'{k}={v}' for k, v in zip(u.by, g.key)))}`: "
                f"**{g.kind}** ({g.share:.0%} of its GPU time)"
                + (f"; fixes: {', '.join(g.fixes)}" if g.fixes else "")
                for g in result.group_diagnoses]
        out += [f"- `{_esc(d.gpu_uuid)}`: **{d.kind}** ({d.phase}): {_esc(d.evidence)}"
                + (f"; fixes: {', '.join(d.fixes)}" if d.fixes else "")
                + (f"; to decide: {_esc(d.decides)}" if d.decides else "")
                for d in result.diagnoses]
    if result.health:
        out += ["", "## Health", ""]
        out += [f"- [{h.severity}] `{_esc(h.gpu_uuid)}` {h.kind}: {_esc(h.evidence)}"
                for h in result.health]
    out += ["", "## Recommendations", ""]
    for i, r in enumerate(p.recommendations, 1):
        flag = "" if r.counted else f" _(not counted: {_esc(r.why_not_counted or '')})_"
        out.append(f"{i}. **{_esc(r.remediation.title)}** (`{r.id}`, {r.remediation.lever}): "
                   f"{100 * r.fraction:.1f}% = {usd(r.monthly_usd)}/month on its own{flag}  ")
        out.append(f"   evidence: {_esc(r.evidence)}  ")
        out.append(f"   typical: {_esc(r.remediation.savings_range)} (source: "
                   f"{_esc(r.remediation.source)})")
    out += ["", "## Savings, combined honestly", "", "| | share | per month |", "|---|---:|---:|",
            f"| measured waste (cap) | {100 * p.waste_fraction:.1f}% | "
            f"{usd(p.monthly_waste_usd)} |",
            f"| efficiency, 1 - prod(1 - f), capped | {100 * p.efficiency_fraction:.1f}% | "
            f"{usd(p.efficiency_monthly_usd)} |",
            f"| rate levers | {100 * p.rate_fraction:.1f}% | |",
            f"| **total, 1 - (1 - F)(1 - D)** | **{100 * p.total_fraction:.1f}%** | "
            f"**{usd(p.monthly_savings_usd)}** |",
            f"| naive sum (WRONG: double-counts) | {100 * p.naive_sum_fraction:.1f}% | |", ""]
    trace = result.extra.get("trace")
    if trace:
        from gpuaudit.report.trace import render_trace_markdown

        out += [render_trace_markdown(trace)]
    if u.notes:
        out += ["## Data notes", ""]
        out += [f"- {_esc(n.reason)} ({n.count:,})" + (f", first at {_esc(n.where)}" if n.where
                                                       else "") for n in u.notes]
        out.append("")
    return "\n".join(out)
