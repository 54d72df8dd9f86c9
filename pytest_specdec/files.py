"""Writing a file so that no reader ever sees half of it: the results, the report and the baselines alike."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """A temporary file beside `path`, renamed over it: the old file stays whole until the rename, and a
    write that fails (a read-only directory, a full disk, an interrupt) takes its temporary file with it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
