"""``python -m microbench.ablate``: see ``microbench.ablate.cli``."""

import sys

from microbench.ablate.cli import main

sys.exit(main())
