"""``python -m gpuaudit.cli``."""

import sys

from gpuaudit.cli import main

sys.exit(main())
