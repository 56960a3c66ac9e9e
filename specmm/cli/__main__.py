"""`python -m specmm.cli ...`: the `specmm` command without the console script."""

import sys

from specmm.cli import main

sys.exit(main())
