"""A catalog row's purchase kind decides what it can price (issue 14, item 3): only a row sold
on demand answers ``--purchase on-demand``; which row was used, and why, is said whenever a
model has several. Checked on every model and provider of the embedded catalog."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from gpuaudit.errors import InputError, PricingError
from gpuaudit.price.catalog import (
    PURCHASE_KINDS,
    PURCHASE_OPTIONS,
    _match,
    embedded_catalog,
    known_models,
    load_user_catalog,
    resolve_rate,
)

PAIRS = sorted({(e.gpu_model, e.provider) for e in embedded_catalog()})


def test_every_row_has_a_known_purchase_kind_and_public_source():
    rows = embedded_catalog()
    assert {e.purchase_kind for e in rows} <= set(PURCHASE_KINDS)
    kinds = {(e.provider, e.instance): e.purchase_kind for e in rows}
    assert kinds[("aws", "p5e.48xlarge")] == "capacity-block"
    assert kinds[("gcp", "a3-highgpu-1g")] == "spot-only"
    for e in rows:  # stray notes such as a mirror host are gone (the cleaned file)
        low = e.source.lower()
        assert "mirror" not in low and "corpus" not in low and ".uat." not in low, e


@pytest.mark.parametrize(("model", "provider"), PAIRS)
@pytest.mark.parametrize("purchase", PURCHASE_OPTIONS)
def test_every_model_is_priced_only_by_a_row_that_sells_it_that_way(model, provider, purchase):
    cands = _match(embedded_catalog(), model, provider)
    cands = [e for e in cands if e.provider == provider]
    assert cands
    od = [e for e in cands if e.purchase_kind == "on-demand"]
    spot = [e for e in cands if e.spot_usd_per_gpu_hour is not None]
    try:
        r = resolve_rate(model, provider=provider, purchase=purchase)
    except PricingError as exc:
        if purchase == "spot":
            assert not spot
        elif purchase == "committed":
            assert not od or "commitment discount" in str(exc)
        else:
            assert not od and "no on-demand price" in str(exc)
            assert all(e.instance in str(exc) for e in cands)  # says what each row is
        return
    row = next(e for e in cands if e.instance == r.instance)
    if purchase == "spot":
        assert r.usd_per_gpu_hour == row.spot_usd_per_gpu_hour
        assert r.usd_per_gpu_hour == min(e.spot_usd_per_gpu_hour or Decimal(0) for e in spot)
        assert r.purchase_kind == "spot"
    else:
        assert row.purchase_kind == "on-demand" and r.purchase_kind == "on-demand"
        assert row.on_demand_usd_per_gpu_hour == min(e.on_demand_usd_per_gpu_hour for e in od)
        assert r.on_demand_usd_per_gpu_hour == row.on_demand_usd_per_gpu_hour
        if purchase == "on-demand":
            assert r.usd_per_gpu_hour == row.on_demand_usd_per_gpu_hour
        else:
            assert r.usd_per_gpu_hour < row.on_demand_usd_per_gpu_hour
    assert r.purchase == purchase
    if len(cands) > 1:  # several rows: which one, and why the others were not
        assert r.choice is not None and r.choice.startswith(f"{r.instance} is the cheapest")
        for e in cands:
            assert e.instance in r.choice
        for e in cands:
            if e.purchase_kind != "on-demand" and purchase != "spot":
                assert f"{e.instance} (${e.on_demand_usd_per_gpu_hour}/GPU-h sold only" in \
                    r.choice
    else:
        assert r.choice is None


def test_h200_on_aws_is_not_the_capacity_block_rate():
    r = resolve_rate("NVIDIA H200", provider="aws")
    assert (r.instance, r.usd_per_gpu_hour, r.purchase) == ("p5en.48xlarge",
                                                            Decimal("7.912"), "on-demand")
    assert r.choice is not None and "p5e.48xlarge" in r.choice and "Capacity Block" in r.choice


def test_every_model_resolves_somewhere_on_demand():
    for model in known_models():
        r = resolve_rate(model)
        assert r.purchase_kind == "on-demand"


def test_user_catalog_purchase_kind(tmp_path: Path):
    p = tmp_path / "prices.toml"
    p.write_text('[[price]]\ngpu_model = "H100 80GB SXM"\nprovider = "onprem"\n'
                 'usd_per_gpu_hour = "2.10"\n'
                 '[[price]]\ngpu_model = "L4 24GB"\nprovider = "onprem"\n'
                 'usd_per_gpu_hour = "0.40"\npurchase_kind = "reserved-only"\n')
    rows = load_user_catalog(p)
    assert [e.purchase_kind for e in rows] == ["on-demand", "reserved-only"]  # old files work
    assert resolve_rate("H100", user_catalog=rows).usd_per_gpu_hour == Decimal("2.10")
    with pytest.raises(PricingError, match="sold only reserved"):
        resolve_rate("L4", provider="onprem", user_catalog=rows)
    p.write_text('[[price]]\ngpu_model = "L4"\nusd_per_gpu_hour = "1"\n'
                 'purchase_kind = "whenever"\n')
    with pytest.raises(InputError, match="purchase_kind"):
        load_user_catalog(p)


def test_report_names_the_row_and_why(tmp_path: Path):
    from gpuaudit.api import audit
    from gpuaudit.cli.audit import demo_path

    rep = audit(demo_path(), gpu_model="H200", provider="aws")
    d = rep.to_dict()
    rate = d["rates"][0]
    assert rate["instance"] == "p5en.48xlarge" and rate["purchase_kind"] == "on-demand"
    assert "p5e.48xlarge" in rate["choice"]
    for fmt in ("terminal", "markdown", "html"):
        text = rep.render(fmt, width=400)
        assert "price row" in text and "not an on-demand price" in text, fmt
