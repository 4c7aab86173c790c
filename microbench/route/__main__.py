"""``python -m microbench.route``."""

import sys

from microbench.route.cli import main

sys.exit(main())
