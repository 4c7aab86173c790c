"""microbench."""

from benchcore.matplotlib_dir import private_matplotlib_dir

private_matplotlib_dir()  # before any module of the package imports matplotlib: nothing written in ~
