"""The suite repository's commit for the results' `environment.commit`: read with git from the working
directory, in the fields pytest-benchmark records (id, time, author_time, dirty, project, branch), so the
pytest-benchmark export and the results agree without pytest-benchmark installed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def commit_info() -> dict[str, Any] | None:
    """The working directory's git commit; None outside a git checkout, or where git is missing or fails
    (the report then shows no commit)."""
    try:
        top = _git("rev-parse", "--show-toplevel")
        commit = _git("rev-parse", "HEAD")
        times = _git("show", "-s", "--format=%cI %aI", "HEAD").split()
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        branch = _git("rev-parse", "--abbrev-ref", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"id": commit, "time": times[0] if times else None, "author_time": times[1] if len(times) > 1 else None,
            "dirty": dirty, "project": Path(top).name, "branch": "(detached head)" if branch == "HEAD" else branch}
