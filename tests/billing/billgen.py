"""A GPU bill and its telemetry, generated from the catalog's real SKUs and prices.

The real FOCUS sample (../shared/data/focus) has no GPU rows, so the billing tests build
their bills here. Instance types, GPUs per instance and hourly prices are the embedded
catalog's rows (``gpuaudit/price/data/catalog_2026-11.csv``): p5.48xlarge on demand,
p4d.24xlarge on spot, g5.12xlarge on a commitment, g6.xlarge with no telemetry, and an Azure
NC24ads A100 v4 billed in EUR. Plus: a refund, a partial hour, an hour past the telemetry,
a node with telemetry but no bill line, and non-GPU lines (storage, a small EC2, tax).

One scenario, written in every format the readers take (FOCUS CSV/Parquet, CUR legacy CSV,
CUR 2.0 Parquet, GCP export), and a telemetry table of 1-minute samples with pods and teams.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpuaudit.price.catalog import CatalogEntry, embedded_catalog
from gpuaudit.schema import build_table

T0 = datetime(2026, 10, 5, tzinfo=timezone.utc)
HOURS = 6


def entry(provider: str, instance: str) -> CatalogEntry:
    return next(e for e in embedded_catalog() if e.provider == provider and e.instance == instance)


def od_hourly(e: CatalogEntry) -> Decimal:
    """The catalog's on-demand price of the whole instance per hour."""
    return e.on_demand_usd_per_gpu_hour * e.gpus_per_instance


@dataclass
class Line:
    start: datetime
    end: datetime
    resource_id: str | None
    resource_name: str | None
    usage_type: str
    description: str
    service: str
    charge_category: str  # Usage, Credit, Purchase, Tax
    pricing_category: str | None  # Standard, Dynamic, Committed
    quantity: Decimal | None
    unit: str | None
    billed: Decimal
    effective: Decimal
    listed: Decimal
    currency: str = "USD"
    charge_class: str | None = None  # FOCUS ChargeClass: Correction
    commitment_id: str | None = None  # FOCUS CommitmentDiscountId
    commitment_status: str | None = None  # FOCUS CommitmentDiscountStatus: Used, Unused
    # FOCUS 1.3: the provider's own split and the contract commitments applied (JSON text)
    allocated_method_id: str | None = None
    allocated_resource_id: str | None = None
    allocated_tags: str | None = None
    contract_applied: str | None = None


@dataclass
class Scenario:
    lines: list[Line] = field(default_factory=list)
    telemetry: pa.Table | None = None
    hosts: dict[str, str] = field(default_factory=dict)  # host -> instance id


def _hour(i: int) -> tuple[datetime, datetime]:
    return T0 + timedelta(hours=i), T0 + timedelta(hours=i + 1)


def scenario() -> Scenario:
    sc = Scenario()
    p5 = entry("aws", "p5.48xlarge")
    p4d = entry("aws", "p4d.24xlarge")
    g5 = entry("aws", "g5.12xlarge")
    g6 = entry("aws", "g6.xlarge")
    az = entry("azure", "Standard_NC24ads_A100_v4")
    assert p4d.spot_usd_per_gpu_hour is not None
    one = Decimal(1)
    # node A: p5.48xlarge on demand, 6 h covered by telemetry + 1 h after it
    for i in range(HOURS + 1):
        s, e = _hour(i)
        price = od_hourly(p5)
        sc.lines.append(Line(s, e, "i-0a11aaaaaaaaaaaa1", "ip-10-0-1-11", "USE1-BoxUsage:p5.48xlarge",
                             f"${price} per On Demand Linux p5.48xlarge Instance Hour",
                             "Amazon Elastic Compute Cloud", "Usage", "Standard", one, "Hours",
                             price, price, price))
    s, e = _hour(2)
    sc.lines.append(Line(s, e, "i-0a11aaaaaaaaaaaa1", "ip-10-0-1-11", "USE1-BoxUsage:p5.48xlarge",
                         "Refund: p5.48xlarge instance retired by AWS",
                         "Amazon Elastic Compute Cloud", "Credit", None, None, None,
                         Decimal("-20.00"), Decimal("-20.00"), Decimal("-20.00")))
    # node B: p4d.24xlarge on spot; the last hour is half an hour
    spot = p4d.spot_usd_per_gpu_hour * p4d.gpus_per_instance
    for i in range(HOURS):
        s, e = _hour(i)
        q = Decimal("0.5") if i == HOURS - 1 else one
        sc.lines.append(Line(s, e, "i-0b12bbbbbbbbbbbb2", "ip-10-0-1-12", "USE1-SpotUsage:p4d.24xlarge",
                             f"${spot:.4f} per Spot Linux p4d.24xlarge Instance Hour",
                             "Amazon Elastic Compute Cloud", "Usage", "Dynamic", q, "Hours",
                             (spot * q).quantize(Decimal("0.0000000001")),
                             (spot * q).quantize(Decimal("0.0000000001")),
                             (od_hourly(p4d) * q).quantize(Decimal("0.0000000001"))))
    # node C: g5.12xlarge on a 1-year commitment: billed 0, effective the committed rate
    committed = (od_hourly(g5) * Decimal("0.65")).quantize(Decimal("0.0001"))
    for i in range(HOURS):
        s, e = _hour(i)
        sc.lines.append(Line(s, e, "i-0c13cccccccccccc3", "ip-10-0-1-13", "USE1-DiscountedUsage:g5.12xlarge",
                             "g5.12xlarge reserved instance applied",
                             "Amazon Elastic Compute Cloud", "Usage", "Committed", one, "Hours",
                             Decimal(0), committed, od_hourly(g5)))
    sc.lines.append(Line(T0, T0 + timedelta(hours=HOURS), None, None, "USE1-HeavyUsage",
                         "Reserved instance fee, 1 yr no upfront", "Amazon Elastic Compute Cloud",
                         "Purchase", "Committed", None, None, committed * HOURS,
                         Decimal(0), committed * HOURS))
    # node D: g6.xlarge billed, never measured
    for i in range(HOURS):
        s, e = _hour(i)
        sc.lines.append(Line(s, e, "i-0d14dddddddddddd4", "ip-10-0-1-14", "USE1-BoxUsage:g6.xlarge",
                             "On Demand Linux g6.xlarge Instance Hour",
                             "Amazon Elastic Compute Cloud", "Usage", "Standard", one, "Hours",
                             od_hourly(g6), od_hourly(g6), od_hourly(g6)))
    # an Azure A100 billed in EUR (kept in EUR: never summed with USD)
    for i in range(2):
        s, e = _hour(i)
        eur = Decimal("3.3100")
        sc.lines.append(Line(s, e, "/subscriptions/x/resourceGroups/ml/providers/Microsoft.Compute/virtualMachines/azvm-01",
                             "azvm-01", "Standard_NC24ads_A100_v4", "NC24ads A100 v4",
                             "Virtual Machines", "Usage", "Standard", one, "Hours", eur, eur, eur,
                             currency="EUR"))
    del az
    # non-GPU lines
    sc.lines.append(Line(T0, T0 + timedelta(hours=HOURS), "arn:aws:s3:::datasets", None,
                         "USE1-TimedStorage-ByteHrs", "S3 standard storage", "Amazon Simple Storage Service",
                         "Usage", "Standard", Decimal("120"), "GB-Mo", Decimal("2.76"),
                         Decimal("2.76"), Decimal("2.76")))
    for i in range(HOURS):
        s, e = _hour(i)
        sc.lines.append(Line(s, e, "i-0e99eeeeeeeeeeee9", "bastion", "USE1-BoxUsage:m5.large",
                             "On Demand Linux m5.large Instance Hour", "Amazon Elastic Compute Cloud",
                             "Usage", "Standard", one, "Hours", Decimal("0.096"),
                             Decimal("0.096"), Decimal("0.096")))
    sc.lines.append(Line(T0, T0 + timedelta(hours=HOURS), None, None, "Tax", "Sales tax",
                         "Tax", "Tax", None, None, None, Decimal("12.34"), Decimal("12.34"),
                         Decimal("12.34")))
    sc.hosts = {"ip-10-0-1-11": "i-0a11aaaaaaaaaaaa1", "ip-10-0-1-12": "i-0b12bbbbbbbbbbbb2",
                "ip-10-0-1-13": "i-0c13cccccccccccc3", "ip-10-0-1-15": "i-0f15ffffffffffff5"}
    sc.telemetry = telemetry()
    return sc


def telemetry() -> pa.Table:
    """1-minute samples over HOURS hours: who held each GPU and how busy it was."""
    minutes = HOURS * 60
    # host -> list of (gpu count, team, project, util, pod or None, minutes measured)
    plan: dict[str, list[tuple[int, str | None, str | None, float, str | None, int]]] = {
        "ip-10-0-1-11": [(4, "vision", "detector", 92.0, "det-train-0", minutes),
                         (2, "nlp", "llm", 30.0, "llm-ft-0", minutes),
                         (2, None, None, 0.0, None, minutes)],
        "ip-10-0-1-12": [(8, "nlp", "llm", 75.0, "llm-pretrain-0", minutes - 30)],
        "ip-10-0-1-13": [(2, "vision", "detector", 0.0, "det-eval-0", minutes),
                         (2, "vision", "detector", 50.0, "det-eval-1", minutes)],
        "ip-10-0-1-15": [(1, "research", "rl", 95.0, "rl-0", minutes)],
    }
    models = {"ip-10-0-1-11": "NVIDIA H100 80GB HBM3", "ip-10-0-1-12": "NVIDIA A100-SXM4-40GB",
              "ip-10-0-1-13": "NVIDIA A10G", "ip-10-0-1-15": "NVIDIA A100-SXM4-80GB"}
    cols: dict[str, list[Any]] = {k: [] for k in ("ts", "host", "gpu_uuid", "gpu_model",
                                                  "gpu_index", "util_gpu_pct", "pod",
                                                  "namespace", "labels")}
    t0 = int(T0.timestamp())
    for host, groups in plan.items():
        idx = 0
        for count, team, project, util, pod, mins in groups:
            for _ in range(count):
                for m in range(mins):
                    cols["ts"].append((t0 + 60 * m) * 1_000_000_000)
                    cols["host"].append(host)
                    cols["gpu_uuid"].append(f"GPU-{host[-2:]}-{idx:02d}")
                    cols["gpu_model"].append(models[host])
                    cols["gpu_index"].append(idx)
                    cols["util_gpu_pct"].append(util)
                    cols["pod"].append(pod)
                    cols["namespace"].append(None if pod is None else "ml")
                    cols["labels"].append([] if team is None else
                                          [("team", team), ("project", project)])
                idx += 1
    order = np.lexsort((np.array(cols["gpu_uuid"]), np.array(cols["ts"])))
    out: dict[str, Any] = {k: [v[i] for i in order] for k, v in cols.items()}
    out["ts"] = pa.array(np.array(out["ts"], dtype=np.int64)).cast(pa.timestamp("ns", "UTC"))
    out["labels"] = pa.array(out["labels"], pa.map_(pa.string(), pa.string()))
    return build_table(out)


# -- writers ------------------------------------------------------------------------------
def _ts(d: datetime, style: str = "iso") -> str:
    if style == "plain":  # as the FOCUS sample data writes them: no T, no Z
        return d.strftime("%Y-%m-%d %H:%M:%S")
    return d.strftime("%Y-%m-%dT%H:%M:%SZ")


def _s(x: Decimal | None) -> str:
    return "" if x is None else str(x)


FOCUS_COLUMNS = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd",
                 "ChargeCategory", "ChargeClass", "ChargeDescription", "PricingCategory",
                 "ProviderName", "ServiceName", "ResourceId", "ResourceName", "SkuId",
                 "x_UsageType", "ConsumedQuantity", "ConsumedUnit", "BilledCost",
                 "EffectiveCost", "ListCost", "BillingCurrency")
#: FOCUS 1.3: the columns above plus commitments, the provider's split, contracts applied
FOCUS13_COLUMNS = (*FOCUS_COLUMNS, "CommitmentDiscountId", "CommitmentDiscountStatus",
                   "AllocatedMethodId", "AllocatedResourceId", "AllocatedTags",
                   "ContractApplied")


def focus_rows(sc: Scenario, style: str = "iso") -> list[dict[str, str]]:
    out = []
    for ln in sc.lines:
        cat = {"Credit": "Credit", "Purchase": "Purchase", "Tax": "Tax",
               "Adjustment": "Adjustment"}.get(ln.charge_category, "Usage")
        out.append({
            "BillingPeriodStart": _ts(datetime(2026, 10, 1, tzinfo=timezone.utc), style),
            "BillingPeriodEnd": _ts(datetime(2026, 11, 1, tzinfo=timezone.utc), style),
            "ChargePeriodStart": _ts(ln.start, style), "ChargePeriodEnd": _ts(ln.end, style),
            "ChargeCategory": cat,
            "ChargeClass": ln.charge_class or ("NULL" if style == "plain" else ""),
            "ChargeDescription": ln.description,
            "PricingCategory": ln.pricing_category or ("NULL" if style == "plain" else ""),
            "ProviderName": "Microsoft" if ln.currency == "EUR" else "AWS",
            "ServiceName": ln.service, "ResourceId": ln.resource_id or "",
            "ResourceName": ln.resource_name or "",
            "SkuId": ln.usage_type.split(":")[-1] if ":" in ln.usage_type else "",
            "x_UsageType": ln.usage_type, "ConsumedQuantity": _s(ln.quantity),
            "ConsumedUnit": ln.unit or "", "BilledCost": _s(ln.billed),
            "EffectiveCost": _s(ln.effective), "ListCost": _s(ln.listed),
            "BillingCurrency": ln.currency,
            "CommitmentDiscountId": ln.commitment_id or "",
            "CommitmentDiscountStatus": ln.commitment_status or "",
            "AllocatedMethodId": ln.allocated_method_id or "",
            "AllocatedResourceId": ln.allocated_resource_id or "",
            "AllocatedTags": ln.allocated_tags or "",
            "ContractApplied": ln.contract_applied or "",
        })
    return out


def write_csv(rows: list[dict[str, str]], path: Path, columns: tuple[str, ...]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", newline="", encoding="utf-8") as f:
        # the FOCUS 1.3 columns a FOCUS 1.0 file leaves out are dropped
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return path


def write_focus_parquet(sc: Scenario, path: Path) -> Path:
    """FOCUS as Parquet with typed columns (timestamps, decimals), as exports write it."""
    lines = sc.lines
    dec = pa.decimal128(38, 10)
    t = pa.table({
        "ChargePeriodStart": pa.array([ln.start for ln in lines], pa.timestamp("us", "UTC")),
        "ChargePeriodEnd": pa.array([ln.end for ln in lines], pa.timestamp("us", "UTC")),
        "ChargeCategory": [{"Credit": "Credit", "Purchase": "Purchase", "Tax": "Tax"}.get(
            ln.charge_category, "Usage") for ln in lines],
        "PricingCategory": [ln.pricing_category for ln in lines],
        "ServiceName": [ln.service for ln in lines],
        "ResourceId": [ln.resource_id for ln in lines],
        "ResourceName": [ln.resource_name for ln in lines],
        "x_UsageType": [ln.usage_type for ln in lines],
        "ConsumedQuantity": pa.array([None if ln.quantity is None else float(ln.quantity)
                                      for ln in lines], pa.float64()),
        "ConsumedUnit": [ln.unit for ln in lines],
        "BilledCost": pa.array([ln.billed for ln in lines], dec),
        "EffectiveCost": pa.array([ln.effective for ln in lines], dec),
        "ListCost": pa.array([ln.listed for ln in lines], dec),
        "BillingCurrency": [ln.currency for ln in lines],
        "ServiceProviderName": ["AWS" for _ in lines],
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path)
    return path


CUR_COLUMNS = ("identity/LineItemId", "bill/BillingEntity", "lineItem/LineItemType",
               "lineItem/UsageStartDate", "lineItem/UsageEndDate", "lineItem/ProductCode",
               "lineItem/UsageType", "lineItem/ResourceId", "lineItem/UsageAmount",
               "lineItem/CurrencyCode", "lineItem/UnblendedCost", "lineItem/LineItemDescription",
               "product/instanceType", "pricing/term", "pricing/unit",
               "pricing/publicOnDemandCost", "reservation/EffectiveCost",
               "resourceTags/user:Name")


def _cur_type(ln: Line) -> str:
    if ln.charge_category == "Credit":
        return "Refund"
    if ln.charge_category == "Tax":
        return "Tax"
    if ln.charge_category == "Purchase":
        return "RIFee"
    if ln.pricing_category == "Committed":
        return "DiscountedUsage"
    return "Usage"


def cur_rows(sc: Scenario) -> list[dict[str, str]]:
    out = []
    for i, ln in enumerate(sc.lines):
        if ln.currency != "USD":
            continue  # AWS bills one currency; the EUR line is Azure's
        typ = _cur_type(ln)
        inst = ln.usage_type.split(":")[-1] if ":" in ln.usage_type else ""
        out.append({
            "identity/LineItemId": f"li-{i}", "bill/BillingEntity": "AWS",
            "lineItem/LineItemType": typ, "lineItem/UsageStartDate": _ts(ln.start),
            "lineItem/UsageEndDate": _ts(ln.end), "lineItem/ProductCode": "AmazonEC2",
            "lineItem/UsageType": ln.usage_type, "lineItem/ResourceId": ln.resource_id or "",
            "lineItem/UsageAmount": _s(ln.quantity), "lineItem/CurrencyCode": "USD",
            # a DiscountedUsage line carries no unblended cost; the RI fee does
            "lineItem/UnblendedCost": _s(ln.billed),
            "lineItem/LineItemDescription": ln.description,
            "product/instanceType": inst,
            "pricing/term": {"Standard": "OnDemand", "Dynamic": "Spot",
                             "Committed": "Reserved"}.get(ln.pricing_category or "", ""),
            "pricing/unit": "Hrs" if ln.unit == "Hours" else (ln.unit or ""),
            "pricing/publicOnDemandCost": _s(ln.listed),
            "reservation/EffectiveCost": _s(ln.effective) if typ == "DiscountedUsage" else "",
            "resourceTags/user:Name": ln.resource_name or "",
        })
    return out


def write_cur2_parquet(sc: Scenario, path: Path) -> Path:
    rows = cur_rows(sc)
    ren = {c: c for c in CUR_COLUMNS}
    cur2 = {"identity/LineItemId": "identity_line_item_id",
            "bill/BillingEntity": "bill_billing_entity",
            "lineItem/LineItemType": "line_item_line_item_type",
            "lineItem/UsageStartDate": "line_item_usage_start_date",
            "lineItem/UsageEndDate": "line_item_usage_end_date",
            "lineItem/ProductCode": "line_item_product_code",
            "lineItem/UsageType": "line_item_usage_type",
            "lineItem/ResourceId": "line_item_resource_id",
            "lineItem/UsageAmount": "line_item_usage_amount",
            "lineItem/CurrencyCode": "line_item_currency_code",
            "lineItem/UnblendedCost": "line_item_unblended_cost",
            "lineItem/LineItemDescription": "line_item_line_item_description",
            "product/instanceType": "product_instance_type", "pricing/term": "pricing_term",
            "pricing/unit": "pricing_unit",
            "pricing/publicOnDemandCost": "pricing_public_on_demand_cost",
            "reservation/EffectiveCost": "reservation_effective_cost",
            "resourceTags/user:Name": "resource_tags_user_name"}
    ren.update(cur2)
    cols: dict[str, list[Any]] = {ren[c]: [] for c in CUR_COLUMNS}
    for r in rows:
        for c in CUR_COLUMNS:
            v: Any = r[c] or None
            if c in ("lineItem/UnblendedCost", "pricing/publicOnDemandCost",
                     "reservation/EffectiveCost", "lineItem/UsageAmount") and v is not None:
                v = float(v) if c == "lineItem/UsageAmount" else Decimal(v)
            if c in ("lineItem/UsageStartDate", "lineItem/UsageEndDate"):
                v = datetime.fromisoformat(v.replace("Z", "+00:00"))
            cols[ren[c]].append(v)
    dec = pa.decimal128(38, 10)
    t = pa.table({k: pa.array(v, dec) if k in ("line_item_unblended_cost",
                                               "pricing_public_on_demand_cost",
                                               "reservation_effective_cost")
                  else pa.array(v) for k, v in cols.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path)
    return path


def usd_gpu_billed(sc: Scenario) -> Decimal:
    """Billed cost of the USD GPU lines (every line naming a catalog GPU instance)."""
    gpu = ("p5.48xlarge", "p4d.24xlarge", "g5.12xlarge", "g6.xlarge")
    return sum((ln.billed for ln in sc.lines if ln.currency == "USD"
                and any(g in ln.usage_type for g in gpu)), Decimal(0))


def write_telemetry(sc: Scenario, path: Path) -> Path:
    assert sc.telemetry is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(sc.telemetry, path)
    return path
