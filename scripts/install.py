"""`pip install ARGS` into this interpreter's environment, done by uv where uv would ask what pip asks.

scripts/setup.sh installs through this. uv installs the same requirements several times faster than pip (a fresh
`.[cpu,test]` on the project's 2-core machine: 46 s against 112 s, docs/ci.md), but it reads neither pip's
configuration files nor the PIP_* variables, so uv alone could ask other indexes, or drop a constraint, that the
user's pip would not. pip's own account of its settings (`pip config list`: its files merged, then the
environment) is therefore carried over to uv's options; a setting uv would not repeat (a proxy, a trusted host,
a client certificate, ...) keeps the install on pip, and so does SPECDEC_INSTALLER=pip. One line says which ran.

Run with the target environment's interpreter (`.venv/bin/python -m scripts.install -e '.[cpu]'`); standard
library only, as the environment holds nothing else yet.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

#: pip settings uv repeats: pip's name -> uv's option (cert: the variable uv reads instead, SSL_CERT_FILE).
CARRIED = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint", "cert": "SSL_CERT_FILE"}
#: pip settings that change how pip talks or what it prints, never what it installs.
HARMLESS = frozenset({"timeout", "default-timeout", "retries", "disable-pip-version-check", "cache-dir",
                      "no-cache-dir", "progress-bar", "quiet", "verbose", "no-color", "no-input", "root-user-action",
                      "require-virtualenv", "log"})
#: The sections of pip's configuration an install reads, weakest first: the files' [global], their [install], the
#: environment's PIP_* variables.
SECTIONS = ("global", "install", ":env:")
#: Where several indexes serve a package, pip takes the best version among all of them; so does uv with this.
UV_FIXED = ("--index-strategy", "unsafe-best-match", "--compile-bytecode")


def pip_settings(listing: str) -> dict[str, str]:
    """The settings an install sees, from `pip config list`'s lines (``section.key='value'``): per key the value of
    the strongest section that sets it. Other commands' sections (``download.``, ``list.``, ...) do not apply."""
    found: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        name, sep, value = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in SECTIONS:
            continue
        found.setdefault(key, {})[section] = str(ast.literal_eval(value))
    return {key: next(by[s] for s in reversed(SECTIONS) if s in by) for key, by in found.items()}


def uv_options(settings: Mapping[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """uv's options and environment that repeat ``settings``, or why uv cannot (the settings it would not follow)."""
    foreign = sorted(key for key in settings if key not in CARRIED and key not in HARMLESS)
    if foreign:
        return f"pip is configured with {', '.join(foreign)}, which uv would not follow"
    options: list[str] = []
    env: dict[str, str] = {}
    for key, flag in CARRIED.items():
        if key not in settings:
            continue
        if key == "cert":
            env[flag] = settings[key]
        else:
            options += [part for value in settings[key].split() for part in (flag, value)]
    return options, env


def requested(environ: Mapping[str, str]) -> str:
    """The installer SPECDEC_INSTALLER asks for: ``uv`` (the default, where pip's settings allow) or ``pip``;
    another value stops the install, naming it, rather than picking one for the user."""
    value = environ.get("SPECDEC_INSTALLER", "uv")
    if value not in ("uv", "pip"):
        raise SystemExit(f"install.py: SPECDEC_INSTALLER={value!r}: use uv (the default) or pip")
    return value


def _uv_ready(python: str) -> bool:
    """uv in this environment, installed with pip (its wheel) when it is not there yet."""
    ran = subprocess.run([python, "-m", "uv", "--version"], capture_output=True)
    if ran.returncode == 0:
        return True
    return subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "uv"]
                          ).returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if list(argv) in (["-h"], ["--help"]):  # everything else is pip's arguments, passed on as they are
        parser = argparse.ArgumentParser(
            prog="python -m scripts.install", description="`pip install ARGS` into this interpreter's environment, "
            "with uv where it repeats pip's settings (`pip config list`), else with pip; SPECDEC_INSTALLER=pip: pip.")
        parser.add_argument("args", nargs="*", help="what `pip install` takes: requirements, -e PATH, ...")
        parser.print_help()
        return 0
    python = sys.executable
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *argv]
    if requested(os.environ) == "pip":
        plan: tuple[list[str], dict[str, str]] | str = "SPECDEC_INSTALLER=pip"
    else:
        listing = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
        plan = uv_options(pip_settings(listing.stdout)) if listing.returncode == 0 else "pip config list failed"
    if not isinstance(plan, str) and not _uv_ready(python):
        plan = "uv could not be installed"
    if isinstance(plan, str):
        print(f"install.py: installing with pip ({plan})", flush=True)
        return subprocess.run(pip).returncode
    options, env = plan
    carried = sorted(key for key in CARRIED if CARRIED[key] in options or CARRIED[key] in env)
    print(f"install.py: installing with uv (pip's settings carried over: {', '.join(carried) or 'none'})", flush=True)
    uv = [python, "-m", "uv", "pip", "install", "--quiet", "--python", python, *UV_FIXED, *options, *argv]
    return subprocess.run(uv, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
