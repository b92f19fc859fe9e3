"""GPU prices: ``--price`` > the user's catalog file > the embedded, dated catalog.

The embedded catalog (``data/catalog_2026-11.csv``) is public per-instance on-demand and spot
pricing for AWS, GCP, Azure, Lambda, CoreWeave and RunPod, each row with its source and the
date it reflects and its ``purchase_kind`` (:data:`PURCHASE_KINDS`): only a row sold on
demand prices ``--purchase on-demand``. Prices are per GPU-hour (instance price / GPUs per
instance). Committed-use rates are on-demand less the provider's typical one-year discount,
with its source.

A GPU model is matched by family (H100, A100, L40S, ...), then memory size and form factor
(SXM, PCIe, NVL) when the name carries them, so NVML names such as
``NVIDIA H100 80GB HBM3`` and user text such as ``H100`` both resolve.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import date
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from gpuaudit.errors import InputError, PricingError
from gpuaudit.hardware import form_factor as _form
from gpuaudit.hardware import gpu_family
from gpuaudit.hardware import memory_gb as _memory_gb
from gpuaudit.validate import PRICE_USD_PER_GPU_HOUR, read_toml_file

__all__ = [
    "COMMITTED_DISCOUNTS",
    "CatalogEntry",
    "Rate",
    "embedded_catalog",
    "gpu_family",
    "known_models",
    "load_user_catalog",
    "resolve_rate",
]

CATALOG_FILE = "catalog_2026-11.csv"
PURCHASE_OPTIONS = ("on-demand", "spot", "committed")
#: How a catalog row's listed price is bought (the ``purchase_kind`` column). Only an
#: ``on-demand`` row can answer ``--purchase on-demand`` (and be the base of ``committed``);
#: a ``capacity-block`` price (AWS EC2 Capacity Blocks, reserved ahead for a fixed window), a
#: ``reserved-only`` price or a ``spot-only`` shape (GCP's 1g/2g/4g A3 shapes: Spot or
#: Flex-start only) is a different product. Any row's spot column answers ``--purchase spot``.
PURCHASE_KINDS = ("on-demand", "capacity-block", "reserved-only", "spot-only")
DEFAULT_PROVIDER = "aws"
PROVIDER_ORDER = ("aws", "gcp", "azure", "coreweave", "lambda", "runpod")

#: One-year commitment discounts, lower end of each public range (remediation_evidence.md).
COMMITTED_DISCOUNTS: dict[str, tuple[Decimal, str]] = {
    "aws": (Decimal("0.35"), "AWS 1-yr Reserved Instances ~35-38% on GPU instances (Vantage data)"),
    "gcp": (Decimal("0.31"), "GCP 1-yr committed use discount 31-37% (Cyclenerd pricing.yml)"),
    "azure": (Decimal("0.30"), "Azure 1-yr reserved instances 30-72% (api-evangelist Azure VM plans)"),
    "coreweave": (Decimal("0.30"), "CoreWeave reserved capacity 'up to 60%' (coreweave.com/pricing), lower end taken"),
}

@dataclass(frozen=True)
class CatalogEntry:
    provider: str
    instance: str
    gpu_model: str
    gpus_per_instance: int
    on_demand_usd_per_gpu_hour: Decimal
    spot_usd_per_gpu_hour: Decimal | None
    source: str
    as_of: str
    line: int = 0
    purchase_kind: str = "on-demand"


@dataclass(frozen=True)
class Rate:
    """The price of one GPU-hour, and where it came from.

    ``on_demand``/``spot``/``committed`` are the same GPU's alternatives at the same provider
    (None where unknown): the recommender's rate levers read them.
    """

    usd_per_gpu_hour: Decimal
    purchase: str
    source: str
    as_of: str
    gpu_model: str | None = None
    provider: str | None = None
    instance: str | None = None
    on_demand_usd_per_gpu_hour: Decimal | None = None
    spot_usd_per_gpu_hour: Decimal | None = None
    committed_usd_per_gpu_hour: Decimal | None = None
    committed_source: str | None = None
    currency: str = "USD"
    #: how the row used is bought (:data:`PURCHASE_KINDS`); None for ``--price``
    purchase_kind: str | None = None
    #: which catalog row was used and why, when the model has several (else None)
    choice: str | None = None

    def describe(self, source_chars: int = 120) -> str:
        """The price line every report prints. A long source is shortened at a segment
        boundary (``; ``, ``, `` or `` + `` outside brackets), never mid-word, and its brackets
        stay balanced; the JSON report carries the whole source."""
        what = " ".join(x for x in (self.provider, self.instance) if x) or "given price"
        src = shorten_source(self.source, source_chars)
        return (f"${self.usd_per_gpu_hour}/GPU-h {self.purchase}"
                f" ({what}; as of {self.as_of}; {src})")


_OPEN, _CLOSE = "([{", ")]}"
_SEPARATORS = ("; ", " + ", ", ")


def shorten_source(text: str, limit: int) -> str:
    """``text`` whole if it fits in ``limit`` characters, else its longest prefix that ends at
    a separator outside any bracket (``; ``, `` + ``, ``, ``), followed by `` ...``; the first
    segment whole when even that is longer. Brackets in what is kept always balance."""
    if len(text) <= limit:
        return text
    depth = 0
    cut = None
    first = None
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0:
            sep = next((s for s in _SEPARATORS if text.startswith(s, i)), None)
            if sep is not None:
                if first is None:
                    first = i
                if i + 4 <= limit:
                    cut = i
                i += len(sep)
                continue
        i += 1
    end = cut if cut is not None else first
    if end is None:
        return text  # one unbreakable segment: shown whole rather than cut mid-word
    return text[:end].rstrip(" ;,+") + " ..."


def _decimal(text: str, where: str, what: str) -> Decimal | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise InputError(f"{what} {text!r} is not a number", where=where,
                         fix="write prices as plain decimals, e.g. 3.99") from None
    if not value.is_finite():
        raise InputError(f"{what} {text!r} is not a finite number", where=where,
                         fix="write prices as plain decimals, e.g. 3.99")
    if value < 0:
        raise InputError(f"{what} {value} is negative", where=where, fix="prices are >= 0")
    return value


def _gpu_hour_price(raw: object, where: str, what: str) -> Decimal | None:
    """A user's price of one GPU-hour: a finite decimal in the range every --price is held to
    (:data:`gpuaudit.validate.PRICE_USD_PER_GPU_HOUR`)."""
    from gpuaudit.validate import PRICE_USD_PER_GPU_HOUR as Q

    value = _decimal(str(raw), where, what)
    if value is not None and Q.high is not None and value > Decimal(str(Q.high)):
        raise InputError(f"{what} {value} is above {Q.high:g} {Q.unit}", where=where,
                         fix=Q.above_hint or f"give {Q.what} in {Q.unit}")
    return value


@lru_cache(maxsize=1)
def embedded_catalog() -> tuple[CatalogEntry, ...]:
    """The catalog shipped with gpuaudit (see ``price/data``), parsed once."""
    text = resources.files("gpuaudit.price").joinpath("data").joinpath(CATALOG_FILE).read_text("utf-8")
    return tuple(_parse_csv(text.splitlines(), f"gpuaudit/price/data/{CATALOG_FILE}"))


def _parse_csv(lines: Iterable[str], name: str) -> list[CatalogEntry]:
    out = []
    for i, row in enumerate(csv.DictReader(lines), start=2):
        where = f"{name}:{i}"
        gpus = int(row["gpus_per_instance"])
        od_inst = _decimal(row["on_demand_usd_per_hour"], where, "on_demand_usd_per_hour")
        per_gpu = _decimal(row["usd_per_gpu_hour"], where, "usd_per_gpu_hour")
        spot_inst = _decimal(row["spot_usd_per_hour"], where, "spot_usd_per_hour")
        if per_gpu is None and od_inst is not None:
            per_gpu = od_inst / gpus
        if per_gpu is None:
            continue
        out.append(CatalogEntry(
            provider=row["provider"].strip().lower(), instance=row["instance"].strip(),
            gpu_model=row["gpu_model"].strip(), gpus_per_instance=gpus,
            on_demand_usd_per_gpu_hour=per_gpu,
            spot_usd_per_gpu_hour=None if spot_inst is None else spot_inst / gpus,
            source=row["source"].strip(), as_of=row["as_of"].strip(), line=i,
            purchase_kind=_purchase_kind(row.get("purchase_kind"), where),
        ))
    return out


def _purchase_kind(value: object, where: str) -> str:
    """A row's purchase kind: one of :data:`PURCHASE_KINDS`; empty or absent means
    on-demand (catalogs written before the column existed keep working)."""
    text = "" if value is None else str(value).strip().lower()
    if not text:
        return "on-demand"
    if text not in PURCHASE_KINDS:
        raise InputError(f"purchase_kind {text!r} is not one of {', '.join(PURCHASE_KINDS)}",
                         where=where, fix="write on-demand, capacity-block, reserved-only or "
                         "spot-only (docs/pricing.md)")
    return text


def read_catalog_toml(path: Path) -> dict[str, Any]:
    """A ``--catalog`` TOML file as a dict (``[[price]]`` and ``[[owned]]`` tables)."""
    return read_toml_file(path, what="price catalog", option="--catalog",
                          format_fix="see docs/pricing.md for the catalog format")


def load_user_catalog(path: str | Path) -> tuple[CatalogEntry, ...]:
    """Read a TOML price file::

        [[price]]
        gpu_model = "H100 80GB SXM"      # matched like the embedded catalog
        provider = "onprem"
        usd_per_gpu_hour = "2.10"        # a string keeps it exact
        spot_usd_per_gpu_hour = "0.90"   # optional
        purchase_kind = "on-demand"      # optional: on-demand (default), capacity-block,
                                         # reserved-only, spot-only
        source = "internal chargeback FY26"
        as_of = "2026-10-01"
    """
    p = Path(path)
    data = read_catalog_toml(p)
    rows = data.get("price")
    if rows is None and isinstance(data.get("owned"), list) and data["owned"]:
        return ()  # only owned hardware (gpuaudit.price.owned reads it)
    if not isinstance(rows, list) or not rows:
        raise InputError("no [[price]] tables", where=str(p),
                         fix="add one [[price]] table per GPU model (docs/pricing.md)")
    out = []
    for i, row in enumerate(rows, start=1):
        where = f"{p} [[price]] #{i}"
        missing = [k for k in ("gpu_model", "usd_per_gpu_hour") if k not in row]
        if missing:
            raise InputError(f"missing {missing}", where=where,
                             fix="each [[price]] needs gpu_model and usd_per_gpu_hour")
        od = _gpu_hour_price(row["usd_per_gpu_hour"], where, "usd_per_gpu_hour")
        assert od is not None
        spot = row.get("spot_usd_per_gpu_hour")
        out.append(CatalogEntry(
            provider=str(row.get("provider", "custom")).lower(),
            instance=str(row.get("instance", "")), gpu_model=str(row["gpu_model"]),
            gpus_per_instance=1, on_demand_usd_per_gpu_hour=od,
            spot_usd_per_gpu_hour=None if spot is None else _gpu_hour_price(
                spot, where, "spot_usd_per_gpu_hour"),
            source=str(row.get("source", f"user catalog {p.name}")),
            as_of=str(row.get("as_of", "unknown")), line=i,
            purchase_kind=_purchase_kind(row.get("purchase_kind"), where),
        ))
    return tuple(out)


def known_models(entries: Iterable[CatalogEntry] | None = None) -> list[str]:
    rows = embedded_catalog() if entries is None else entries
    return sorted({e.gpu_model for e in rows})


def _match(entries: Iterable[CatalogEntry], model: str, provider: str | None = None
           ) -> list[CatalogEntry]:
    """Rows for ``model``: those naming it exactly (at ``provider`` when given), else those of
    its family narrowed by memory and form factor where the name carries them."""
    rows = list(entries)
    exact = [e for e in rows if e.gpu_model.lower() == model.strip().lower()
             and (provider is None or e.provider == provider)]
    if exact:
        return exact
    fam = gpu_family(model)
    if fam is None:
        return []
    cands = [e for e in rows if gpu_family(e.gpu_model) == fam]
    mem = _memory_gb(model)
    if mem is not None:
        by_mem = [e for e in cands if _memory_gb(e.gpu_model) == mem]
        cands = by_mem or cands
    form = _form(model)
    if form is not None:
        by_form = [e for e in cands if _form(e.gpu_model) == form]
        cands = by_form or cands
    return cands


def _answers(e: CatalogEntry, purchase: str) -> bool:
    """Whether row ``e`` can price ``purchase``: spot needs a spot price; on-demand and
    committed (on-demand less a discount) need a row sold on demand."""
    if purchase == "spot":
        return e.spot_usd_per_gpu_hour is not None
    return e.purchase_kind == "on-demand"


def resolve_rate(
    gpu_model: str | None,
    *,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    user_catalog: Iterable[CatalogEntry] = (),
    today: date | None = None,
) -> Rate:
    """The :class:`Rate` for one GPU model, by the precedence in this module's doc.

    Raises :class:`PricingError` naming the known models (or providers) when nothing matches.
    """
    if purchase not in PURCHASE_OPTIONS:
        raise PricingError(f"unknown purchase option {purchase!r}",
                           fix=f"use one of {', '.join(PURCHASE_OPTIONS)}")
    if price is not None:
        value = PRICE_USD_PER_GPU_HOUR.check_decimal(price, "price")
        return Rate(usd_per_gpu_hour=value, purchase=purchase, source="--price (given by user)",
                    as_of=(today or date.today()).isoformat(), gpu_model=gpu_model,
                    provider=provider, on_demand_usd_per_gpu_hour=value
                    if purchase == "on-demand" else None)
    if gpu_model is None:
        raise PricingError(
            "the samples do not name the GPU model, so no price can be looked up",
            fix="pass --gpu-model (one of: " + ", ".join(known_models()) + ") or --price "
            "USD_PER_GPU_HOUR",
        )
    user = list(user_catalog)
    for pool, label in ((user, "user catalog"), (list(embedded_catalog()), "embedded catalog")):
        if not pool:
            continue
        prov = (provider or "").lower() or None
        cands = _match(pool, gpu_model, prov)
        if not cands:
            continue
        if prov is not None:
            in_prov = [e for e in cands if e.provider == prov]
            if not in_prov:
                if label == "user catalog":
                    continue
                have = sorted({e.provider for e in cands})
                raise PricingError(
                    f"no {label} price for {gpu_model!r} at provider {provider!r}",
                    fix=f"providers with this GPU: {', '.join(have)}; or pass --price",
                )
            cands = in_prov
        elif label == "embedded catalog":
            # the first provider (in PROVIDER_ORDER) with a row that can answer the purchase
            order = sorted(PROVIDER_ORDER, key=lambda p: not any(
                e.provider == p and _answers(e, purchase) for e in cands))
            for p in order:
                in_prov = [e for e in cands if e.provider == p]
                if in_prov:
                    cands = in_prov
                    break
        return _rate_from(cands, gpu_model, purchase, label)
    raise PricingError(
        f"unknown GPU model {gpu_model!r}: no price in the catalog",
        fix="use one of: " + ", ".join(known_models(user + list(embedded_catalog())))
        + "; or pass --price USD_PER_GPU_HOUR, or --catalog prices.toml",
    )


_KIND_PHRASE = {"capacity-block": "sold only as a Capacity Block (reserved ahead for a fixed "
                                  "window)",
                "reserved-only": "sold only reserved", "spot-only": "sold only as spot",
                "on-demand": "on demand"}


def _choice(cands: list[CatalogEntry], used: CatalogEntry, purchase: str) -> str | None:
    """Which row was used and why, when the model has several rows at the provider."""
    if len(cands) < 2:
        return None
    spot = purchase == "spot"
    others = []
    for e in sorted(cands, key=lambda x: x.line):
        if e is used:
            continue
        if spot:
            why = ("no spot price" if e.spot_usd_per_gpu_hour is None else
                   f"spot ${e.spot_usd_per_gpu_hour:.4f}/GPU-h, "
                   + ("same" if e.spot_usd_per_gpu_hour == used.spot_usd_per_gpu_hour
                      else "dearer"))
        elif e.purchase_kind != "on-demand":
            why = (f"${e.on_demand_usd_per_gpu_hour}/GPU-h {_KIND_PHRASE[e.purchase_kind]}: "
                   "not an on-demand price")
        else:
            why = (f"${e.on_demand_usd_per_gpu_hour}/GPU-h, "
                   + ("same price, listed later" if e.on_demand_usd_per_gpu_hour
                      == used.on_demand_usd_per_gpu_hour else "dearer"))
        others.append(f"{e.instance} ({why})")
    kind = "spot" if spot else "on-demand"
    return (f"{used.instance} is the cheapest {kind} row of {len(cands)} for "
            f"{used.gpu_model} at {used.provider}; not used: {'; '.join(others)}")


def _rate_from(cands: list[CatalogEntry], asked: str, purchase: str, label: str) -> Rate:
    # The cheapest on-demand row for this GPU at this provider: a conservative waste figure.
    # Only a row sold on demand can answer on-demand (or be the base of committed): a
    # Capacity-Block or reserved-only price is a different product (PURCHASE_KINDS).
    od_rows = [e for e in cands if e.purchase_kind == "on-demand"]
    spot_rows = [e for e in cands if e.spot_usd_per_gpu_hour is not None]
    spot = min(spot_rows, key=lambda e: (e.spot_usd_per_gpu_hour or 0, e.line)) \
        if spot_rows else None
    where = cands[0].provider
    if not od_rows and purchase != "spot":
        sold = "; ".join(f"{e.instance} at ${e.on_demand_usd_per_gpu_hour}/GPU-h is "
                         f"{_KIND_PHRASE[e.purchase_kind]}" for e in cands)
        raise PricingError(
            f"no on-demand price for {asked!r} at {where}: {sold}",
            fix="pass --price with the rate you pay (e.g. your Capacity Block's), another "
            "--provider" + (", or --purchase spot" if spot is not None else ""),
        )
    best = min(od_rows, key=lambda e: (e.on_demand_usd_per_gpu_hour, e.line)) if od_rows \
        else None
    disc = COMMITTED_DISCOUNTS.get(where)
    committed = best.on_demand_usd_per_gpu_hour * (1 - disc[0]) if disc and best else None
    if purchase == "spot":
        if spot is None or spot.spot_usd_per_gpu_hour is None:
            raise PricingError(
                f"no spot price for {asked!r} at {where}",
                fix="use --purchase on-demand, another --provider, or --price",
            )
        return Rate(
            usd_per_gpu_hour=spot.spot_usd_per_gpu_hour, purchase="spot",
            source=f"{label}: {spot.source}", as_of=spot.as_of, gpu_model=spot.gpu_model,
            provider=spot.provider, instance=spot.instance,
            on_demand_usd_per_gpu_hour=best.on_demand_usd_per_gpu_hour if best else None,
            spot_usd_per_gpu_hour=spot.spot_usd_per_gpu_hour,
            committed_usd_per_gpu_hour=committed, committed_source=disc[1] if disc else None,
            purchase_kind="spot", choice=_choice(cands, spot, purchase),
        )
    assert best is not None
    base = Rate(
        usd_per_gpu_hour=best.on_demand_usd_per_gpu_hour, purchase="on-demand",
        source=f"{label}: {best.source}", as_of=best.as_of, gpu_model=best.gpu_model,
        provider=best.provider, instance=best.instance,
        on_demand_usd_per_gpu_hour=best.on_demand_usd_per_gpu_hour,
        spot_usd_per_gpu_hour=spot.spot_usd_per_gpu_hour if spot else None,
        committed_usd_per_gpu_hour=committed, committed_source=disc[1] if disc else None,
        purchase_kind=best.purchase_kind, choice=_choice(cands, best, purchase),
    )
    if purchase == "committed":
        if committed is None or disc is None:
            raise PricingError(
                f"no commitment discount known for provider {best.provider!r}",
                fix="use --purchase on-demand, or --price with your committed rate",
            )
        return replace(base, usd_per_gpu_hour=committed, purchase="committed",
                       source=f"{label}: {best.source}; less {disc[0]:.0%}: {disc[1]}")
    return base


def resolve_rates(
    models: Iterable[str | None],
    *,
    gpu_model: str | None = None,
    price: Decimal | str | float | None = None,
    provider: str | None = None,
    purchase: str = "on-demand",
    catalog: str | Path | None = None,
) -> Mapping[str | None, Rate]:
    """A rate for each GPU model seen in the samples. ``gpu_model`` (the user's word) overrides
    what the samples say."""
    user = load_user_catalog(catalog) if catalog is not None else ()
    out: dict[str | None, Rate] = {}
    for m in set(models):
        out[m] = resolve_rate(gpu_model or m, price=price, provider=provider,
                              purchase=purchase, user_catalog=user)
    return out
