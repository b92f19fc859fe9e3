"""Monthly budgets per team: month-to-date spend, a month-end forecast with its interval, and
an alert when the forecast crosses the budget.

The budget file (TOML)::

    currency = "USD"              # optional, default USD
    by = "team"                   # the --by key the budgets are set on (default team)
    month = "2026-10"             # optional: default, the month of the bill's last period
    usd_per_gpu_hour = "6.52"     # optional: the rate the Prometheus rule prices GPU-hours at
    label = "team"                # optional: the series label holding the team (the rule)

    [budgets]
    vision = "20000.00"           # strings keep amounts exact
    nlp = "15000"

Forecast: month-to-date spend + the mean daily spend x the days left. Interval (90 %,
normal approximation, days taken as independent): +- 1.645 x s x sqrt(r + r^2 / d), with s
the standard deviation of the daily spend over the d days so far and r the days left (the
r^2/d term is the uncertainty of the mean itself). Status: ``over budget`` (already),
``will exceed`` (the whole interval above), ``forecast exceeds`` (the forecast above),
``may exceed`` (only the interval's top above), ``ok``.
"""

from __future__ import annotations

import calendar
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuaudit.errors import InputError
from gpuaudit.validate import read_toml_file

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Budgets", "budget_status", "forecast", "load_budgets"]

Z90 = Decimal("1.645")


@dataclass(frozen=True)
class Budgets:
    monthly: Mapping[str, Decimal]
    currency: str = "USD"
    by: str = "team"
    month: str | None = None
    usd_per_gpu_hour: Decimal | None = None
    label: str = "team"
    path: str = ""


def _money(v: object, where: str) -> Decimal:
    try:
        d = Decimal(str(v))
    except InvalidOperation:
        raise InputError(f"{v!r} is not an amount", where=where,
                         fix='write amounts as strings, e.g. "20000.00"') from None
    if not d.is_finite() or d < 0:
        raise InputError(f"{v!r} is not a non-negative amount", where=where,
                         fix='write amounts as strings, e.g. "20000.00"')
    return d


def load_budgets(path: str | Path) -> Budgets:
    """Read a budget file (see the module doc); errors name the file and the key."""
    p = Path(path)
    doc = read_toml_file(p, what="budget file", option="--budgets",
                         format_fix="see docs/billing.md for the budget file")
    table = doc.get("budgets")
    if not isinstance(table, dict) or not table:
        raise InputError("no [budgets] table", where=str(p),
                         fix='add [budgets] with one line per team: vision = "20000.00"')
    unknown = sorted(set(doc) - {"currency", "by", "month", "usd_per_gpu_hour", "label",
                                 "budgets"})
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r}", where=str(p),
                         fix="keys: currency, by, month, usd_per_gpu_hour, label, [budgets]")
    month = doc.get("month")
    if month is not None:
        try:
            datetime.strptime(str(month), "%Y-%m")
        except ValueError:
            raise InputError(f"month {month!r} is not YYYY-MM", where=f"{p}: month",
                             fix='write month = "2026-10"') from None
    rate = doc.get("usd_per_gpu_hour")
    return Budgets(
        monthly={str(k): _money(v, f"{p}: [budgets] {k}") for k, v in table.items()},
        currency=str(doc.get("currency", "USD")), by=str(doc.get("by", "team")),
        month=None if month is None else str(month),
        usd_per_gpu_hour=None if rate is None else _money(rate, f"{p}: usd_per_gpu_hour"),
        label=str(doc.get("label", "team")), path=str(p))


def forecast(daily: Sequence[Decimal], days_in_month: int
             ) -> tuple[Decimal, Decimal, Decimal, Decimal]:
    """(month to date, forecast, low, high) from the daily spend of the days so far."""
    d = len(daily)
    mtd = sum(daily, Decimal(0))
    if d == 0:
        return mtd, mtd, mtd, mtd
    r = max(days_in_month - d, 0)
    mean = mtd / d
    fc = mtd + mean * r
    if d >= 2:
        var = sum(((x - mean) ** 2 for x in daily), Decimal(0)) / (d - 1)
        half = Z90 * (var * (r + Decimal(r * r) / d)).sqrt()
    else:
        half = Decimal(0)
    return mtd, fc, max(fc - half, mtd), fc + half


def _status(budget: Decimal, mtd: Decimal, fc: Decimal, lo: Decimal, hi: Decimal) -> str:
    if mtd > budget:
        return "over budget"
    if lo > budget:
        return "will exceed"
    if fc > budget:
        return "forecast exceeds"
    if hi > budget:
        return "may exceed"
    return "ok"


def budget_status(budgets: Budgets, showback: pa.Table, keys: Sequence[str],
                  today: date | None = None) -> dict[str, Any]:
    """Month-to-date, forecast and status per budgeted team, from the showback rows (the
    ``team`` lines, in the budget's currency)."""
    if budgets.by not in keys:
        raise InputError(f"budgets are set by {budgets.by!r} but the bill is split by "
                         f"{', '.join(keys)}", where=budgets.path,
                         fix=f"add --by {budgets.by} (or set by = ... in the budget file)")
    rows = showback.to_pydict()
    spend: dict[tuple[str, date], int] = {}
    last: datetime | None = None
    months = set()
    for i in range(showback.num_rows):
        # the bill's month: its last charge period in any currency and line (a budget in
        # EUR on a bill whose EUR lines are all unallocated still means the bill's month)
        start: datetime = rows["period_start"][i]
        months.add(start.strftime("%Y-%m"))
        if rows["currency"][i] != budgets.currency or rows["kind"][i] != "team":
            continue
        end: datetime = rows["period_end"][i]
        last = end if last is None or end > last else last
    month = budgets.month or (max(months) if months else
                              (today or datetime.now(timezone.utc).date()).strftime("%Y-%m"))
    y, m = (int(x) for x in month.split("-"))
    first = date(y, m, 1)
    n_days = calendar.monthrange(y, m)[1]
    for i in range(showback.num_rows):
        if rows["currency"][i] != budgets.currency or rows["kind"][i] != "team":
            continue
        start = rows["period_start"][i]
        if start.strftime("%Y-%m") != month:
            continue
        team = rows[budgets.by][i]
        k = (team, start.date())
        spend[k] = spend.get(k, 0) + int(rows["amount"][i])
    if today is not None:
        as_of = today
    elif last is not None and last.strftime("%Y-%m") == month:
        as_of = (last - timedelta(microseconds=1)).date()
    elif last is not None and last.date() >= first + timedelta(days=n_days):
        as_of = first + timedelta(days=n_days - 1)
    else:
        as_of = first
    days = max(1, min((as_of - first).days + 1, n_days))
    from gpuaudit.price.billing.currency import digits

    d_ccy = digits(budgets.currency)  # the showback's amounts are in its minor units
    teams = []
    alerts = []
    for team, budget in sorted(budgets.monthly.items()):
        daily = [Decimal(spend.get((team, first + timedelta(days=j)), 0)).scaleb(-d_ccy)
                 for j in range(days)]
        mtd, fc, lo, hi = forecast(daily, n_days)
        status = _status(budget, mtd, fc, lo, hi)
        q = Decimal("0.01")
        teams.append({"team": team, "budget": str(budget.quantize(q)),
                      "month_to_date": str(mtd.quantize(q)), "forecast": str(fc.quantize(q)),
                      "forecast_low": str(lo.quantize(q)), "forecast_high": str(hi.quantize(q)),
                      "days_so_far": days, "days_in_month": n_days, "status": status})
        if status in ("over budget", "will exceed", "forecast exceeds"):
            alerts.append(f"{budgets.by} {team}: month-end forecast {fc.quantize(q)} "
                          f"{budgets.currency} (90% {lo.quantize(q)}..{hi.quantize(q)}) vs "
                          f"budget {budget.quantize(q)}: {status}")
    return {"month": month, "as_of": as_of.isoformat(), "currency": budgets.currency,
            "by": budgets.by, "file": budgets.path, "teams": teams, "alerts": alerts}
