"""Settings shared by every test.

Hypothesis' default 200 ms deadline per example turns a loaded 2-core machine (CI, or several
suites side by side) into random failures; tests never assert timings, so no example has one.

Under CI (``CI`` set) the examples are derandomized: the same examples every run, so a result
on a commit is reproducible and a failure names a case that fails again. A developer's run
draws new examples each time and explores further (``HYPOTHESIS_PROFILE=explore`` forces it).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("gpuaudit", deadline=None, print_blob=True)
settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "gpuaudit"))
