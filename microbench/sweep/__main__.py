"""``python -m microbench.sweep``: see ``microbench.sweep.cli``."""

import sys

from microbench.sweep.cli import main

sys.exit(main())
