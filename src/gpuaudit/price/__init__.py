"""Price: what GPU time cost, in Decimal dollars, and how much of it was waste."""

from gpuaudit.price.catalog import Rate, embedded_catalog, known_models, resolve_rate, resolve_rates
from gpuaudit.price.cost import CostLine, CostReport, Energy, price_usage

__all__ = ["CostLine", "CostReport", "Energy", "Rate", "embedded_catalog", "known_models",
           "price_usage", "resolve_rate", "resolve_rates"]
