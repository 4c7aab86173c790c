"""``python -m microbench.loadgen``: see ``microbench.loadgen.cli``."""

import sys

from microbench.loadgen.cli import main

sys.exit(main())
