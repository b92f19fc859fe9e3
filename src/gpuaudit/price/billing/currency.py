"""ISO 4217 currency codes and their minor units (``data/iso4217.csv``).

A bill's currency must be a code in use: ``XYZ`` is a clear error, not a silent third
column of money. Each currency's amounts round to its own minor unit (JPY 0 digits, USD 2,
BHD 3).
"""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache
from importlib import resources

__all__ = ["known_currency", "minor_units", "quantum"]


@lru_cache(maxsize=1)
def _table() -> dict[str, int]:
    text = resources.files("gpuaudit").joinpath("data/iso4217.csv").read_text(encoding="utf-8")
    out: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or line.startswith("code,"):
            continue
        code, digits = line.split(",")
        out[code] = int(digits)
    return out


def known_currency(code: str | None) -> bool:
    return code is not None and code in _table()


def minor_units(code: str) -> int:
    """Digits after the decimal point of ``code`` (KeyError for an unknown code)."""
    return _table()[code]


def quantum(code: str) -> Decimal:
    """The smallest amount of ``code``: Decimal('0.01') for USD, Decimal('1') for JPY."""
    return Decimal(1).scaleb(-minor_units(code))


def digits(code: str) -> int:
    """Minor units of ``code``, 2 for a code not in the table (a bill's codes are checked
    when it is read)."""
    return _table().get(code, 2)


def units_per_minor(code: str) -> int:
    """1e-12 units (the join's scale) in one minor unit of ``code``: 1e10 for USD's cent,
    1e12 for a yen, 1e9 for a fils of BHD."""
    return int(10 ** (12 - digits(code)))
