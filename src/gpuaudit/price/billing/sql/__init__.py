"""The bill's join in portable SQL (``join.py``), its dialect rules (``dialects.py``) and the
engines that run it (``engines.py``)."""

from gpuaudit.price.billing.sql.dialects import DIALECTS, Dialect
from gpuaudit.price.billing.sql.join import (
    COST_COLUMNS,
    INPUTS,
    METHODS,
    PHASE_COLS,
    RESULTS,
    UNITS_PER_USD,
    inputs_ddl,
    relations,
    script,
)

__all__ = ["COST_COLUMNS", "DIALECTS", "INPUTS", "METHODS", "PHASE_COLS", "RESULTS",
           "UNITS_PER_USD", "Dialect", "inputs_ddl", "relations", "script"]
