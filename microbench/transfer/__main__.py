"""``python -m microbench.transfer``: see ``microbench.transfer.cli``."""

import sys

from microbench.transfer.cli import main

sys.exit(main())
