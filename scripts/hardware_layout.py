"""Move baseline files of the layout without a hardware folder into their machine's folder, keeping every night.

    .venv/bin/python -m scripts.hardware_layout baselines/ [--check]

Before, a profile's files lay at ``<root>/<profile>/<suite module>/<test>.json``, one machine's per checkout; now
each machine keeps its own folder, ``<root>/<profile>/<hardware>/<suite module>/<test>.json``, named by
`gate.baselines.hardware_key` from the file's own comparability record (the machine it was measured on). A file
tracked by git is moved with `git mv` (its history follows it), any other by rename. Nothing is overwritten.

Then every machine's files are read back the way a session reads them (`gate.store.BaselineStore`, one per
machine and profile) and the sessions counted: the command fails unless as many sessions are read after the move
as the files held before. ``--check`` moves nothing: it counts the sessions a session reads per machine folder,
and fails on a file left in the old layout.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pytest_specdec.formats import CONVERT as HINT
from pytest_specdec.gate.baselines import BaselineError, hardware_key, load
from pytest_specdec.gate.store import BaselineStore, stale_layout


def old_files(root: Path) -> list[tuple[str, Path]]:
    """(profile, file) of every baseline file in the old layout under ``root``."""
    profiles = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    return [(p.name, f) for p in profiles for module in stale_layout(root, p.name)
            for f in sorted(module.glob("*.json"))]


def sessions_read(root: Path) -> dict[tuple[str, str], int]:
    """(profile, machine folder) -> the sessions a session on that machine reads, as `BaselineStore` reads them."""
    out: dict[tuple[str, str], int] = {}
    for profile in sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []:
        for folder in sorted(d for d in profile.iterdir() if d.is_dir()):
            if folder in stale_layout(root, profile.name):
                continue
            store = BaselineStore(root, profile.name, {}, mode=None, keep=1)
            store.hardware = folder.name
            files = store.all_files()
            datas = store.readable()
            if len(datas) != len(files):
                raise SystemExit(f"{folder}: {len(files) - len(datas)} of {len(files)} file(s) cannot be read; "
                                 f"fix them first (an older schema: {HINT})")
            out[(profile.name, folder.name)] = sum(len(d["sessions"]) for d in datas)
    return out


def move(src: Path, dst: Path) -> None:
    """``git mv`` when git tracks ``src``, else a rename; never over an existing file."""
    if dst.exists():
        raise SystemExit(f"{dst} exists already: not overwriting it with {src}; merge the two by hand")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", src.name], cwd=src.parent,
                             capture_output=True).returncode == 0
    if tracked:
        subprocess.run(["git", "mv", src.name, str(dst.resolve())], cwd=src.parent, check=True)
    else:
        src.rename(dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="the baselines' root, e.g. baselines/")
    ap.add_argument("--check", action="store_true", help="move nothing: count the sessions read per machine folder")
    args = ap.parse_args(argv)
    root: Path = args.root
    todo = old_files(root)
    if args.check and todo:
        print(f"{len(todo)} file(s) in the old layout, e.g. {todo[0][1]}: run without --check to move them")
        return 1
    before = sum(sessions_read(root).values())
    moved = 0
    for profile, f in todo:
        try:
            data = load(f, HINT)
        except BaselineError as exc:
            raise SystemExit(f"{exc}") from None
        assert data is not None
        dst = root / profile / hardware_key(data["comparability"]) / f.parent.name / f.name
        before += len(data["sessions"])
        move(f, dst)
        moved += 1
    for module in {f.parent for _, f in todo}:
        if module.is_dir() and not any(module.iterdir()):
            module.rmdir()
    after = sessions_read(root)
    for (profile, folder), n in sorted(after.items()):
        print(f"{root / profile / folder}: {n} session(s) read")
    total = sum(after.values())
    print(f"{moved} file(s) moved; {before} session(s) before, {total} read after")
    if total != before:
        print(f"session count changed: {before} before, {total} after", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
