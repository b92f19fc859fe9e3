"""Settings shared by every test.

Hypothesis' default 200 ms deadline per example turns a loaded 2-core machine (CI, or several
suites side by side) into random failures; tests never assert timings, so no example has one.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("gpuaudit", deadline=None)
settings.load_profile("gpuaudit")
