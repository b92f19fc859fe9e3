"""Realised savings: last month's bill report against this month's.

``compare_reports(last, this)`` reads two JSON reports of ``gpuaudit bill --format json``
and says, per team and per remediation, what was projected last time and what the bill
shows now. Amounts are per month (720 h) from each report's telemetry window, so a 30-day
and a 31-day bill compare; per team the realised saving is last month's cost less this
month's (its idle share apart); per remediation, what was projected then, what is still
projected now, and the part of the projection taken since (projected then less now).
Currencies are never mixed: each is compared on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpuaudit.errors import InputError

__all__ = ["compare_reports"]

HOURS_PER_MONTH = Decimal(720)
Q = Decimal("0.01")


def _hours(bill: Mapping[str, Any], where: str) -> Decimal:
    tw = bill.get("telemetry_window")
    if not tw:
        raise InputError("the report has no telemetry window", where=where,
                         fix="compare reports written by gpuaudit bill --format json")
    s = datetime.fromisoformat(tw["start"].replace("Z", "+00:00"))
    e = datetime.fromisoformat(tw["end"].replace("Z", "+00:00"))
    h = Decimal(str((e - s).total_seconds())) / 3600
    if h <= 0:
        raise InputError("the report's telemetry window is empty", where=where,
                         fix="compare reports of bills with measured GPU time")
    return h


def _bill(doc: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    b = doc.get("extra", {}).get("bill") if isinstance(doc, Mapping) else None
    if not isinstance(b, Mapping) or "currencies" not in b:
        raise InputError("not a gpuaudit bill report (no extra.bill)", where=where,
                         fix="write each month with gpuaudit bill BILL --telemetry ... "
                         "--format json -o month.json")
    return b


def _teams(bill: Mapping[str, Any]) -> dict[tuple[str, str], tuple[Decimal, Decimal]]:
    """(currency, line) -> (amount, idle part) for team and idle lines."""
    out: dict[tuple[str, str], tuple[Decimal, Decimal]] = {}
    for ccy, c in bill["currencies"].items():
        for ln in c["lines"]:
            if ln["kind"] not in ("team", "idle"):
                continue
            idle = Decimal(ln["phases"].get("idle", "0"))
            out[(ccy, ln["line"])] = (Decimal(ln["amount"]), idle)
    return out


def compare_reports(last: Mapping[str, Any], this: Mapping[str, Any], *,
                    last_name: str = "last", this_name: str = "this") -> dict[str, Any]:
    """Per team and per remediation: last month vs this month (see the module doc)."""
    lb, tb = _bill(last, last_name), _bill(this, this_name)
    lh, th = _hours(lb, last_name), _hours(tb, this_name)
    lt, tt = _teams(lb), _teams(tb)
    teams = []
    for key in sorted(set(lt) | set(tt)):
        la, li = lt.get(key, (Decimal(0), Decimal(0)))
        ta, ti = tt.get(key, (Decimal(0), Decimal(0)))
        lm, tm = la / lh * HOURS_PER_MONTH, ta / th * HOURS_PER_MONTH
        lim, tim = li / lh * HOURS_PER_MONTH, ti / th * HOURS_PER_MONTH
        teams.append({"currency": key[0], "line": key[1], "last": str(la.quantize(Q)),
                      "this": str(ta.quantize(Q)), "last_monthly": str(lm.quantize(Q)),
                      "this_monthly": str(tm.quantize(Q)),
                      "realised_monthly": str((lm - tm).quantize(Q)),
                      "idle_last_monthly": str(lim.quantize(Q)),
                      "idle_this_monthly": str(tim.quantize(Q)),
                      "idle_realised_monthly": str((lim - tim).quantize(Q))})
    lr = {r["id"]: r for r in last.get("recommendations", [])}
    tr = {r["id"]: r for r in this.get("recommendations", [])}
    rems = []
    for rid in sorted(set(lr) | set(tr)):
        a = Decimal(lr[rid]["monthly_usd"]) if rid in lr else Decimal(0)
        b = Decimal(tr[rid]["monthly_usd"]) if rid in tr else Decimal(0)
        title = (lr.get(rid) or tr[rid])["title"]
        rems.append({"id": rid, "title": title, "projected_last_monthly": str(a.quantize(Q)),
                     "projected_this_monthly": str(b.quantize(Q)),
                     "taken_monthly": str((a - b).quantize(Q)),
                     "status": "new" if rid not in lr else
                     "done" if rid not in tr else "open"})
    return {"last": {"name": last_name, "hours": float(round(lh, 4)),
                     "window": lb.get("telemetry_window")},
            "this": {"name": this_name, "hours": float(round(th, 4)),
                     "window": tb.get("telemetry_window")},
            "teams": teams, "remediations": rems,
            "note": "monthly = amount / telemetry hours x 720; realised = last month's less "
                    "this month's; taken = projected then less still projected now (USD "
                    "recommendations)"}
