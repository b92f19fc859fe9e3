"""`python -m gpuaudit` runs the command line, as the `gpuaudit` script does."""

import sys

from gpuaudit.cli import main

if __name__ == "__main__":
    sys.exit(main())
