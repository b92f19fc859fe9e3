"""The pipeline after classification is composed once (gpuaudit.api.assemble): every entry
point's report equals classify -> rates -> assemble on the same usage."""

from __future__ import annotations

import json

from coretables import series_table

import gpuaudit
from gpuaudit.api import assemble, rates_for
from gpuaudit.classify import classify
from gpuaudit.recommend import Finding


def _json(report) -> dict:
    d = report.to_dict()
    d.pop("generated_at", None)
    return json.loads(json.dumps(d, default=str))


def test_audit_is_classify_then_assemble():
    table = series_table({"g0": [0, 0, 95, 97, 50, 40] * 20, "g1": [5, 85, 5, 85] * 30},
                         interval_s=1.0)
    findings = (Finding(signal="input_stall_share", value=0.4, text="DataLoader waits"),)
    whole = gpuaudit.audit(table, price="2.50", counts={"tokens": 1e6},
                           energy_usd_per_kwh="0.12", findings=findings)
    usage = classify(table, findings=findings)
    parts = assemble(usage, rates_for(usage, price="2.50"), counts={"tokens": 1e6},
                     energy_usd_per_kwh="0.12", findings=findings,
                     extra={"timeline": whole.extra["timeline"]})
    assert _json(parts) == _json(whole)
    assert parts.cost == whole.cost and parts.plan == whole.plan


def test_assemble_carries_extra_and_findings():
    table = series_table({"g0": [0] * 50 + [30] * 50})
    usage = classify(table)
    plain = assemble(usage, rates_for(usage, price="3"))
    assert plain.extra == {}
    tagged = assemble(usage, rates_for(usage, price="3"), extra={"note": 1})
    assert tagged.extra == {"note": 1}
    assert tagged.cost == plain.cost
