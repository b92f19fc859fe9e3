"""Money is Decimal. Round only when presenting, and keep the identities exact.

One hourly figure feeds every projection: daily = 24 h, monthly = 720 h (24 x 30), yearly =
8,760 h. The hourly figure is kept to a hundredth of a cent so that each projection is that
figure times its hours, exactly, and rounds to the cent from there.

Presentation (docs/money.md, "How money is shown"): an *amount* (a cost, a waste, a saving, a
projection) is shown to the cent by :func:`format_usd`; a *rate* (money per hour, per GPU-hour,
per kWh, per unit of work) keeps the precision it was listed or computed at and always carries
its unit, by :func:`format_rate`. Every renderer uses these two and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import ROUND_HALF_EVEN, Decimal

__all__ = [
    "CENT",
    "HOURLY_QUANTUM",
    "HOURS_PER_DAY",
    "HOURS_PER_MONTH",
    "HOURS_PER_YEAR",
    "J_PER_KWH",
    "allocate_cents",
    "cents",
    "dec",
    "format_rate",
    "format_usd",
    "projections",
]

CENT = Decimal("0.01")
HOURLY_QUANTUM = Decimal("0.0001")
HOURS_PER_DAY = 24
HOURS_PER_MONTH = 720
HOURS_PER_YEAR = 8760
SECONDS_PER_HOUR = Decimal(3600)
J_PER_KWH = Decimal(3_600_000)


def dec(x: float | int | str | Decimal) -> Decimal:
    """A float measured in the pipeline (seconds, joules) as an exact Decimal, to 1e-9."""
    if isinstance(x, Decimal):
        return x
    if isinstance(x, int):
        return Decimal(x)
    if isinstance(x, str):
        return Decimal(x)
    return Decimal(repr(round(float(x), 9)))


def cents(x: Decimal) -> Decimal:
    """Round half-even to the cent (presentation only)."""
    return x.quantize(CENT, rounding=ROUND_HALF_EVEN)


def hourly(x: Decimal) -> Decimal:
    return x.quantize(HOURLY_QUANTUM, rounding=ROUND_HALF_EVEN)


def projections(hourly_amount: Decimal) -> dict[str, Decimal]:
    """daily, monthly and yearly from one hourly figure (already quantized by :func:`hourly`)."""
    return {
        "hourly": hourly_amount,
        "daily": hourly_amount * HOURS_PER_DAY,
        "monthly": hourly_amount * HOURS_PER_MONTH,
        "yearly": hourly_amount * HOURS_PER_YEAR,
    }


def allocate_cents(parts: Sequence[Decimal]) -> list[Decimal]:
    """Round each part to the cent so the rounded parts sum to the rounded total exactly.

    Largest remainder: floor every part to the cent, then give the missing cents to the parts
    with the largest remainders. Parts must be non-negative.
    """
    if not parts:
        return []
    total = cents(sum(parts, Decimal(0)))
    floors = [(p / CENT).to_integral_value(rounding="ROUND_FLOOR") * CENT for p in parts]
    missing = int((total - sum(floors, Decimal(0))) / CENT)
    order = sorted(range(len(parts)), key=lambda i: (parts[i] - floors[i], -i), reverse=True)
    out = list(floors)
    if missing >= 0:
        for i in order[:missing]:
            out[i] += CENT
    else:
        for i in order[::-1][: -missing]:
            out[i] -= CENT
    return out


def format_usd(x: Decimal) -> str:
    """An amount as a reader sees it: dollars to the cent, thousands separated (``$1,234.56``)."""
    return f"${cents(x):,.2f}"


def format_rate(x: Decimal, unit: str) -> str:
    """A rate with its unit (``$6.88/GPU-h``, ``$55.0400/h``): the digits it was listed or
    computed at, never rounded to the cent, so the figure a projection multiplies is the one
    shown. Trailing zeros a listed price carries are kept; no exponent is ever printed."""
    return f"${x:,f}/{unit}"
