"""gpuaudit: where GPU time goes, what it costs, and what to change.

The pipeline runs one way: measure -> classify -> price -> recommend -> report. Each stage
is callable on its own; :func:`audit` composes them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
