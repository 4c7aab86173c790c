"""Atomic file writes: a temporary file in the same folder, fsync, ``os.replace``: never half a file.

On any failure the temporary file is removed and the error names the file being written (a full disk's
``OSError`` names none by itself).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel

__all__ = ["atomic_write_bytes", "write_model"]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing (the temporary file is removed on any failure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # e.g. a full disk names no file: name it
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def write_model(path: Path, record: BaseModel) -> None:
    """A pydantic object as indented JSON, atomically."""
    atomic_write_bytes(path, (record.model_dump_json(indent=2) + "\n").encode())
