"""The cloud bill: FOCUS / CUR / GCP readers, GPU lines, the join to measured GPU time,
reconciliation to the cent, and budgets (docs/billing.md)."""

from gpuaudit.price.billing.readers import BILL_FORMATS, Bill, detect_format, open_bill

__all__ = ["BILL_FORMATS", "Bill", "detect_format", "open_bill"]
