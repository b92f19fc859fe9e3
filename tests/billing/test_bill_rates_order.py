"""The bill's per-instance rate rows come in one order: billed cost, largest first, and rows
that bill the same (committed usage bills $0, so every reserved instance type ties) by
instance, GPU model and pricing category. The database returns tied rows of a plain
``ORDER BY`` in whatever order its hash table gives; the 10M-line benchmark saw two reports
of one bill list two $0 rows both ways."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import billgen

from gpuaudit.api import bill


def test_tied_rate_rows_are_ordered_by_instance_model_category(sc: billgen.Scenario,
                                                             tmp_path: Path) -> None:
    # every GPU usage line billed $0, as committed usage is: all rate rows tie on billed cost
    zero = Decimal(0)
    lines = [replace(ln, billed=zero) if ln.charge_category == "Usage" and ln.quantity
             else ln for ln in sc.lines]
    tied = replace(sc, lines=lines)
    focus = billgen.write_csv(billgen.focus_rows(tied, "plain"), tmp_path / "focus.csv",
                              billgen.FOCUS_COLUMNS)
    r = bill(focus, telemetry=billgen.write_telemetry(tied, tmp_path / "run.parquet"))
    rates = r.extra["bill"]["currencies"]["USD"]["rates"]
    assert len(rates) >= 4  # the scenario's p5, p4d, g5, g6 (and more) instance types
    billed = [Decimal(x["billed"]) for x in rates]
    assert billed == sorted(billed, reverse=True)
    key = [(-Decimal(x["billed"]), x["instance"] or "", x["gpu_model"] or "",
            x["pricing_category"] or "") for x in rates]
    assert key == sorted(key)
    # the same bill read again lists them the same way
    again = bill(focus, telemetry=tmp_path / "run.parquet")
    assert again.extra["bill"]["currencies"]["USD"]["rates"] == rates
