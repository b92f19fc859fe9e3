"""gpuaudit: where GPU time goes, what it costs, and what to change.

The pipeline runs one way: measure -> classify -> price -> recommend -> report. Each stage
is callable on its own; :func:`audit` composes them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Report", "__version__", "audit", "audit_fleet", "bill", "monitor", "monitored"]

_LAZY = {"monitor": "gpuaudit.monitor", "monitored": "gpuaudit.monitor",
         "audit": "gpuaudit.api", "Report": "gpuaudit.api", "bill": "gpuaudit.api",
         "audit_fleet": "gpuaudit.api"}


def __getattr__(name: str) -> object:
    # load the pipeline and the sampler only when used, keeping `import gpuaudit` light
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuaudit' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # replaces the submodule attribute the import just set
    return value
