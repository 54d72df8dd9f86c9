"""The package's files a test passes through: every `pytest_specdec` file whose functions ran (a `sys.setprofile`
call event, module bodies left out) while pytest ran the given tests, one path a line.

    .venv/bin/python -m scripts.trace_files --out trace.txt \\
        tests/functional/test_baselines_e2e.py::test_workflow_update_regress_accept

Run on two checkouts (a `git worktree` of the older one, from its root), the two lists compare what a change
added to or took from a test's path: collection, the sessions pytester runs in-process, the verdicts, the writers.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

#: The package's folder, found without importing it (pytest's assertion rewriting warns about a module imported
#: before it starts).
_SPEC = importlib.util.find_spec("pytest_specdec")
assert _SPEC is not None and _SPEC.origin is not None, "pytest_specdec is not installed"
ROOT = str(Path(_SPEC.origin).parent) + os.sep
#: Where the list is written, one path (relative to the package) a line.
OUT_ENV = "SPECDEC_TRACE_OUT"
_seen: set[str] = set()


def _profile(frame: FrameType, event: str, arg: Any) -> None:
    if event == "call":
        code = frame.f_code
        if code.co_name != "<module>" and code.co_filename.startswith(ROOT):
            _seen.add(code.co_filename.removeprefix(ROOT))


def pytest_configure(config: pytest.Config) -> None:
    if OUT_ENV not in os.environ:
        raise pytest.UsageError(f"scripts.trace_files: set {OUT_ENV} to the file the list is written to")
    sys.setprofile(_profile)
    threading.setprofile(_profile)


def pytest_unconfigure(config: pytest.Config) -> None:
    sys.setprofile(None)
    threading.setprofile(None)
    Path(os.environ[OUT_ENV]).write_text("".join(f"{name}\n" for name in sorted(_seen)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the file the list is written to")
    ap.add_argument("tests", nargs="+", help="what pytest runs (node ids, files, options after --)")
    args = ap.parse_args(argv)
    os.environ[OUT_ENV] = str(args.out.resolve())
    code = pytest.main(["-p", "scripts.trace_files", "-p", "no:cacheprovider", "-q", *args.tests])
    print(f"{len(args.out.read_text().splitlines())} files of pytest_specdec ran: {args.out}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
