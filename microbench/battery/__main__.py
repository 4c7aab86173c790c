"""``python -m microbench.battery``."""

import sys

from microbench.battery.cli import main

sys.exit(main())
