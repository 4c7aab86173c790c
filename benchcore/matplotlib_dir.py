"""matplotlib's config and font cache in a folder of the process's own, removed when it exits.

matplotlib writes its font cache into ``~/.cache/matplotlib`` (or ``~/.config/matplotlib``) when it is
first imported: outside a command's output folder, where nothing of the suite may write. The packages
whose commands draw figures (``analysis``, ``microbench``) call ``private_matplotlib_dir`` when they are
imported, which is before any of their modules imports matplotlib: it points ``MPLCONFIGDIR`` at a fresh
temporary folder that is removed at exit (the cache is rebuilt each run: about a second). A
``MPLCONFIGDIR`` the user set is theirs and kept; a process that imported matplotlib already is left
alone.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

__all__ = ["private_matplotlib_dir"]


def private_matplotlib_dir() -> None:
    """Point matplotlib at a temporary config folder of this process, removed at exit."""
    if "MPLCONFIGDIR" in os.environ or "matplotlib" in sys.modules:
        return
    path = tempfile.mkdtemp(prefix="matplotlib-")
    os.environ["MPLCONFIGDIR"] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
