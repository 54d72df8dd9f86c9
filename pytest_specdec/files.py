"""Writing a file so that no reader ever sees half of it: the results, the report and the baselines alike."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """A temporary file beside `path`, renamed over it: the old file stays whole until the rename, and a
    write that fails (a read-only directory, a full disk, an interrupt) takes its temporary file with it. The
    temporary name is the writer's own (pid and a random token), so two sessions replacing one file (reports/
    latest.json, also from two machines on a shared directory) never write into each other's temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
