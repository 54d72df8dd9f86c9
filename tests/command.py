"""Commands run in the test's process, as the functional tests run them: `pytest-specdec` (`specdec_cli`) and any
entry point's `main` (`in_process`).

`cli.main` is what the console script calls; a child process per call would import numpy and scipy again, about
1.5 CPU-seconds each, and the functional tests call the command some fifty times.
`tests/functional/test_cli.py::test_the_installed_console_script_runs` runs the installed script itself.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path


def in_process(main: Callable[[], int | None], argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``main()`` as a process would end: its status (None is 0; a `SystemExit`'s code as the interpreter takes it,
    argparse's on --help or a usage error) and what it printed. ``argv`` only names the run."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main() or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())


def specdec_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`pytest-specdec ARGS`: its exit status (argparse's own on --help or a usage error) and what it printed."""
    from pytest_specdec.cli import main

    argv = [str(a) for a in args]
    return in_process(lambda: main(argv), ["pytest-specdec", *argv])
