"""The plugin's import path, in a fresh interpreter: what `pytest --help` and a session import."""

from __future__ import annotations

from pathlib import Path


def test_the_plugins_import_path_leaves_out_the_trainer_and_the_measurement_command() -> None:
    """Importing the plugin, its session and the cpu profile (whose models are zoo paths) imports neither torch
    nor the zoo's trainer or measurement command: `pytest --help` stays fast on a machine without torch."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = ("import sys, pytest_specdec.plugin, pytest_specdec.session, pytest_specdec.cli\n"
            "from pytest_specdec.profiles import load_profile\n"
            "load_profile('cpu')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' "
            "or m.startswith('pytest_specdec.zoo.')))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(root)}, cwd=root,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]", out
    usage = subprocess.run([sys.executable, "-m", "pytest_specdec.zoo.measure", "--help"], capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(root)}, cwd=root, text=True, timeout=120, check=True)
    assert usage.stdout.startswith("usage: python -m pytest_specdec.zoo.measure")
