"""The JSON report: a documented, versioned schema (docs/json-schema.md).

Money is a string of dollars with cents (``"1234.56"``), never a float. The hourly figures
keep four decimals so every projection is that figure times its hours, exactly, rounded to
the cent. Within a cost line the phase costs plus unobserved cost sum to the observed cost to
the cent (largest-remainder rounding). Field names are stable within a major version; new
fields may be added in a minor version.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpuaudit import __version__
from gpuaudit.classify.usage import CPU_FIELDS, PHASE_LOWER_PCT, PHASES, PhaseTime
from gpuaudit.price.cost import CostLine
from gpuaudit.price.money import cents
from gpuaudit.result import AuditResult

if TYPE_CHECKING:
    from gpuaudit.recommend.plan import Plan

__all__ = ["SCHEMA_ID", "SCHEMA_VERSION", "dumps", "indented", "plan_fields", "presented", "to_dict"]

SCHEMA_ID = "gpuaudit.report"
SCHEMA_VERSION = "1.3"


def _usd(x: Decimal) -> str:
    return str(cents(x))


def _frac(x: Decimal | float) -> float:
    return round(float(x), 6)


def _s(x: float) -> float:
    """Seconds to the nanosecond: a profiler trace's window is a fraction of a second, and
    milliseconds would make its shares read wrong (0.009 s of 0.009 s for 8.8 of 8.9 ms)."""
    return round(x, 9)


def phases_dict(t: PhaseTime) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seconds": {p: _s(v) for p, v in t.phase_seconds().items()},
        "shares_pct": t.phase_shares_pct(),
        "observed_s": _s(t.observed_s),
        "unobserved_s": _s(t.unobserved_s),
        "gap_s": _s(t.gap_s),
        "no_reading_s": _s(t.no_reading_s),
        "mean_util_pct": None if t.mean_util_pct is None else round(t.mean_util_pct, 2),
        "samples": t.samples,
        "sm_view": None,
    }
    if t.has_sm_view:
        secs = t.sm_phase_seconds()
        out["sm_view"] = {
            "seconds": {p: _s(v) for p, v in secs.items()},
            "shares_pct": t.sm_phase_shares_pct(),
            "mean_sm_active_pct": round(100 * t.sm_busy_s / sum(secs.values()), 2)
            if sum(secs.values()) > 0 else None,
        }
    return out


def cost_line_dict(ln: CostLine) -> dict[str, Any]:
    cl = ln.in_cents()
    return {
        "observed_usd": str(cl.observed),
        "by_phase_usd": {p: str(cl.phase[p]) for p in PHASES},
        "unobserved_usd": str(cl.unobserved),
        "waste_usd": str(cl.waste),
        "idle_usd": str(cl.idle),
        "underutilized_waste_usd": str(cl.underutilized_waste),
        "headroom_usd": str(cl.headroom),
        "waste_share_pct": round(100 * ln.waste_share, 2),
        "gpu_hours": _frac(ln.gpu_hours),
        "effective_gpu_hours": _frac(ln.effective_gpu_hours),
    }


def _run_phase(r: Any) -> dict[str, Any]:
    return {"name": r.name, "start_s": round(r.start_s, 3), "end_s": round(r.end_s, 3),
            "mean_util_pct": None if r.mean_util_pct is None else round(r.mean_util_pct, 2),
            "idle_share": round(r.idle_share, 4), "busy_share": round(r.busy_share, 4),
            "signals": {k: round(v, 4) for k, v in r.signals.items()}}


def _cpu(s: Any) -> dict[str, float | None] | None:
    """The CPU beside a GPU (percent of all the host's cores), or None where none was
    measured."""
    vals = {k: getattr(s, k) for k in CPU_FIELDS}
    if all(v is None for v in vals.values()):
        return None
    return {k: None if v is None else round(v, 2) for k, v in vals.items()}


def to_dict(result: AuditResult) -> dict[str, Any]:
    u, c, p = result.usage, result.cost, result.plan
    cp, wp = c.cost_projection, c.waste_projection
    patterns = {x.gpu_uuid: x for x in u.patterns}
    series = u.series_by_uuid()
    gpus = []
    for ln in c.per_gpu:
        uuid = str(ln.key[0])
        s = series.get(uuid)
        pat = patterns.get(uuid)
        gpus.append({
            "gpu_uuid": uuid,
            "host": s.host if s else None,
            "gpu_model": s.gpu_model if s else None,
            "mig_profile": s.mig_profile if s else None,
            "pods": list(s.pods) if s else [],
            "pattern": None if pat is None else {"kind": pat.kind, "evidence": pat.evidence},
            "idle_gaps": None if s is None else {
                "count": s.idle_gaps,
                "quartiles_s": None if s.idle_gap_quartiles_s is None
                else [round(q, 3) for q in s.idle_gap_quartiles_s],
                "dispersion": None if s.idle_gap_dispersion is None
                else round(s.idle_gap_dispersion, 3)},
            "cpu": None if s is None else _cpu(s),
            "phases": phases_dict(ln.time),
            "cost": cost_line_dict(ln),
        })
    groups = [
        {"key": dict(zip(c.group_keys, ln.key)), "phases": phases_dict(ln.time),
         "cost": cost_line_dict(ln)}
        for ln in c.per_group
    ]
    energy = None
    if c.energy is not None:
        energy = {"kwh": _frac(c.energy.kwh), "method": c.energy.method,
                  "usd_per_kwh": None if c.energy.usd_per_kwh is None else str(c.energy.usd_per_kwh),
                  "cost_usd": None if c.energy.cost is None else _usd(c.energy.cost)}
    per_eff = c.cost_per_effective_gpu_hour
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "demo": _demo(result.extra.get("demo")),
        "source": {
            "kind": u.source,
            "origin": u.origin,
            "interval_s": u.interval_s,
            "cap_s": u.cap_s,
            "window_start": u.window_start.isoformat() if u.window_start else None,
            "window_end": u.window_end.isoformat() if u.window_end else None,
            "wall_hours": _frac(c.wall_hours),
            "gpus": len(u.series),
            "notes": [{"reason": n.reason, "count": n.count, "where": n.where,
                       "column": n.column} for n in u.notes],
            "events": list(u.events),
        },
        "rates": [
            {"gpu_model_seen": k, "gpu_model": r.gpu_model, "usd_per_gpu_hour": str(r.usd_per_gpu_hour),
             "purchase": r.purchase, "provider": r.provider, "instance": r.instance,
             "source": r.source, "as_of": r.as_of, "currency": r.currency,
             "purchase_kind": r.purchase_kind, "choice": r.choice}
            for k, r in sorted(c.rates.items(), key=lambda kv: str(kv[0]))
        ],
        "phases": {
            "thresholds_pct": dict(zip(PHASES, PHASE_LOWER_PCT)),
            "overall": phases_dict(c.total.time),
        },
        "cost": {
            "currency": c.currency,
            **cost_line_dict(c.total),
            "hourly_usd": str(cp["hourly"]),
            "daily_usd": _usd(cp["daily"]),
            "monthly_usd": _usd(cp["monthly"]),
            "yearly_usd": _usd(cp["yearly"]),
            "waste_hourly_usd": str(wp["hourly"]),
            "waste_daily_usd": _usd(wp["daily"]),
            "waste_monthly_usd": _usd(wp["monthly"]),
            "waste_yearly_usd": _usd(wp["yearly"]),
            "usd_per_effective_gpu_hour": None if per_eff is None else str(per_eff),
            "unit_costs_usd": {k: str(v) for k, v in c.unit_costs_shown.items()},
            "counts": {k: str(v) for k, v in c.counts.items()},
            "energy": energy,
        },
        "gpus": gpus,
        "groups": {"by": list(c.group_keys), "rows": groups},
        "patterns": [{"gpu_uuid": x.gpu_uuid, "kind": x.kind, "evidence": x.evidence,
                      "shape": x.shape or x.kind,
                      "run_phases": [_run_phase(r) for r in x.run_phases]}
                     for x in u.patterns],
        "job_patterns": [{"job": j.job, "gpu_uuids": list(j.gpu_uuids), "kind": j.kind,
                          "shape": j.shape, "evidence": j.evidence} for j in u.job_patterns],
        "job_diagnoses": [{"job": j.job, "kind": j.kind, "gpu_uuids": list(j.gpu_uuids),
                           "gpus_with_kind": j.with_kind, "evidence": j.evidence,
                           "fixes": list(j.fixes)} for j in result.job_diagnoses],
        "group_diagnoses": [{"key": dict(zip(c.group_keys, g.key)), "kind": g.kind,
                             "gpu_time_share": g.share, "gpu_uuids": list(g.gpu_uuids),
                             "evidence": g.evidence, "fixes": list(g.fixes)}
                            for g in result.group_diagnoses],
        "diagnoses": [{"gpu_uuid": d.gpu_uuid, "kind": d.kind, "evidence": d.evidence,
                       "phase": d.phase, "top": d.top, "fixes": list(d.fixes),
                       "numbers": dict(d.numbers), "decides": d.decides}
                      for d in result.diagnoses],
        "health": [{"gpu_uuid": h.gpu_uuid, "kind": h.kind, "severity": h.severity,
                    "evidence": h.evidence} for h in result.health],
        "findings": [{"signal": getattr(f, "signal", None), "value": getattr(f, "value", None),
                      "text": getattr(f, "text", str(f))} for f in u.findings],
        **plan_fields(p),
        "extra": {k: v for k, v in result.extra.items() if k != "demo"},
    }
    out: dict[str, Any] = presented(doc)
    return out


def plan_fields(p: Plan) -> dict[str, Any]:
    """The report's ``recommendations`` and ``savings`` (what a capacity document's ``plan``
    shows, without the rest of the report)."""
    return {
        "recommendations": [
            {
                "id": r.id, "title": r.remediation.title, "lever": r.remediation.lever,
                "group": r.remediation.group, "vocabulary": list(r.remediation.vocabulary),
                "counted": r.counted, "why_not_counted": r.why_not_counted,
                "status": r.status, "premise": r.remediation.premise,
                "premise_held": r.premise_held, "decided_by": r.decided_by,
                "fraction": _frac(r.fraction), "cap_fraction": _frac(r.cap),
                "monthly_usd": _usd(r.monthly_usd), "evidence": r.evidence,
                "scope": list(r.scope), "acts_on": r.remediation.acts_on,
                "preconditions": list(r.remediation.preconditions),
                "savings_range": r.remediation.savings_range, "source": r.remediation.source,
            }
            for r in p.recommendations
        ],
        "savings": {
            "waste_fraction": _frac(p.waste_fraction),
            "efficiency_uncapped_fraction": _frac(p.efficiency_uncapped_fraction),
            "efficiency_fraction": _frac(p.efficiency_fraction),
            "rate_fraction": _frac(p.rate_fraction),
            "total_fraction": _frac(p.total_fraction),
            "monthly_cost_usd": _usd(p.monthly_cost_usd),
            "monthly_waste_usd": _usd(p.monthly_waste_usd),
            "monthly_savings_usd": _usd(p.monthly_savings_usd),
            "monthly_after_usd": _usd(p.monthly_after_usd),
            "efficiency_monthly_usd": _usd(p.efficiency_monthly_usd),
            "rate_monthly_usd": _usd(p.rate_monthly_usd),
            "naive_sum_fraction": _frac(p.naive_sum_fraction),
            "naive_sum_label": "WRONG: adding the fractions double-counts overlapping fixes; "
                               "shown only for comparison",
            "notes": list(p.notes),
        },
    }


def _demo(notice: Any) -> dict[str, str] | None:
    """The top-level ``demo`` field: null for a report of real, user-given data; for the
    bundled recording audited in place of this machine, ``{statement, reason, recording}``."""
    if not isinstance(notice, dict) or not notice.get("statement"):
        return None
    return {k: str(notice.get(k, "")) for k in ("statement", "reason", "recording")}


def presented(value: Any) -> Any:
    """Floats as a reader should see them: 15 significant digits, so binary noise such as
    ``0.9930000000000001`` (0.331 x 3) reads ``0.993``. The one place the JSON report rounds
    a float; every other field is already exact (money is a string of Decimal).

    Dicts and lists are rebuilt (tuples as lists); other values pass as they are. A report of
    1,000 GPUs holds ~300,000 values, most of them in the timeline's lists (numbers rounded
    to a tenth, a few hundred distinct ones), so scalars are passed without a call and each
    distinct float is formatted once (:func:`_present_float`)."""
    memo: dict[float, float] = {}

    def number(x: float) -> float:
        if not x:  # a zero presents as itself, its sign too (and 0.0 == -0.0: not memoized)
            return x if type(x) is float else float(x)  # (numpy's as a float)
        y = memo.get(x)
        if y is None:
            y = _present_float(x)
            if y is not x:  # (NaN and the infinities are kept as they are)
                memo[x] = y
        return y

    def walk(v: Any) -> Any:
        t = type(v)
        if t in _AS_IS:
            return v
        if isinstance(v, float):  # (numpy's float64 too)
            return number(v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):  # (the timeline's lists: floats, one call each)
            return [number(x) if type(x) is float else x if type(x) in _AS_IS else walk(x)
                    for x in v]
        return v

    return walk(value)


#: the types :func:`presented` passes without looking further (exactly these, no subclasses)
_AS_IS = frozenset((int, str, bool, type(None)))


def _present_float(x: float) -> float:
    """``x`` to 15 significant digits; NaN and the infinities as they are."""
    return float(f"{x:.15g}") if x == x and x not in (float("inf"), float("-inf")) else x


def dumps(result: AuditResult) -> str:
    return indented(to_dict(result))


def indented(doc: Any) -> str:
    """``json.dumps(doc, indent=2, default=str) + "\\n"``, byte for byte, faster: the
    standard library encodes in C only without ``indent`` (a 6 MB bill report: 0.6 s of
    Python), so the values are encoded in C and msgspec re-indents the text (whitespace only;
    a NaN, which msgspec does not read, takes the slow path)."""
    import msgspec

    flat = json.dumps(doc, default=str)
    try:
        return msgspec.json.format(flat.encode(), indent=2).decode() + "\n"
    except msgspec.DecodeError:
        return json.dumps(doc, indent=2, default=str) + "\n"
