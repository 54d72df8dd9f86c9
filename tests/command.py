"""The `pytest-specdec` command run in the test's process, as the functional tests run it.

`cli.main` is what the console script calls; a child process per call would import numpy and scipy again, about
1.5 CPU-seconds each, and the functional tests call the command some fifty times.
`tests/functional/test_cli.py::test_the_installed_console_script_runs` runs the installed script itself.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path


def specdec_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`pytest-specdec ARGS`: its exit status (argparse's own on --help or a usage error) and what it printed."""
    from pytest_specdec.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help, a usage error
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return subprocess.CompletedProcess(["pytest-specdec", *argv], code, out.getvalue(), err.getvalue())
