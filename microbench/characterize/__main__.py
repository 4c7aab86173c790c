"""``python -m microbench.characterize`` (see ``cli``)."""

import sys

from microbench.characterize.cli import main

sys.exit(main())
