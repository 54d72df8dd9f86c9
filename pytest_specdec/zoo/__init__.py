"""The packaged CPU model zoo: tiny models built by ``python -m pytest_specdec.zoo.train``.

Why it exists: on a machine with no GPU and no model hub the plugin still needs a real target
and real drafters for vLLM to run.  ``target`` (4-layer Llama), ``draft`` (1-layer Llama distilled
from it), ``eagle3`` (an EAGLE-3 head for the target) and ``eagle3-degraded`` (the same head
under-trained on purpose: the regression a benchmark must catch) live in ``zoo/models/``, with
``draft-slow``, ``draft-slow10`` and ``draft-slow20`` (the draft plus layers that add exactly zero: the same outputs and
acceptance but slower drafting, the pure timing regressions a benchmark must catch), ``draft-wide2048`` (the
draft's MLP widened from 512 to 2048 units that add exactly zero: a smaller step of the same regression) and a
``MANIFEST.json`` of sha256 sums.  This module only uses the standard library, so importing it (as the plugin does)
keeps ``pytest --help`` fast; torch is needed only by ``train.py``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pytest_specdec.errors import SpecDecError

__all__ = ["MODELS_DIR", "NAMES", "REBUILD_COMMAND", "ZooError", "manifest", "verify_zoo",
           "zoo_path"]

#: Where the trained models are shipped, inside the installed package.
MODELS_DIR = Path(__file__).resolve().parent / "models"
#: The model directories the zoo provides.
NAMES = ("target", "draft", "eagle3", "eagle3-degraded", "draft-slow", "draft-slow10", "draft-slow20",
         "draft-wide2048")
#: The command that retrains the whole zoo (it writes MODELS_DIR and its manifest).
REBUILD_COMMAND = "python -m pytest_specdec.zoo.train"

_verified: dict[tuple[str, int, int], bool] = {}


class ZooError(SpecDecError):
    """A zoo model is unknown, missing or does not match MANIFEST.json."""


def manifest(models_dir: Path = MODELS_DIR) -> dict[str, Any]:
    """Parsed MANIFEST.json; ZooError if it is missing or unreadable."""
    path = models_dir / "MANIFEST.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ZooError(f"zoo manifest {path} is missing; rebuild the zoo with "
                       f"`{REBUILD_COMMAND}`") from None
    except (OSError, ValueError) as exc:
        raise ZooError(f"zoo manifest {path} is unreadable ({exc}); rebuild the zoo with "
                       f"`{REBUILD_COMMAND}`") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ZooError(f"zoo manifest {path} has no 'files' table; rebuild the zoo with "
                       f"`{REBUILD_COMMAND}`")
    return data


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks (also used by train.py to write the manifest)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_files(models_dir: Path, names: tuple[str, ...]) -> None:
    files: dict[str, dict[str, Any]] = manifest(models_dir)["files"]
    for name in names:
        entries = {rel: meta for rel, meta in files.items() if rel.split("/", 1)[0] == name}
        if not entries:
            raise ZooError(f"zoo model {name!r} is not in {models_dir / 'MANIFEST.json'}; "
                           f"rebuild the zoo with `{REBUILD_COMMAND}`")
        for rel, meta in sorted(entries.items()):
            path = models_dir / rel
            if not path.is_file():
                raise ZooError(f"zoo file {path} is missing; rebuild the zoo with "
                               f"`{REBUILD_COMMAND}`")
            size = path.stat().st_size
            key = (str(path), size, path.stat().st_mtime_ns)
            if _verified.get(key):
                continue
            if size != meta.get("size") or sha256_file(path) != meta.get("sha256"):
                raise ZooError(f"zoo file {path} is corrupted (size/sha256 differ from "
                               f"MANIFEST.json; a Git LFS pointer or a partial checkout?); "
                               f"rebuild the zoo with `{REBUILD_COMMAND}`")
            _verified[key] = True


def verify_zoo(models_dir: Path = MODELS_DIR) -> dict[str, Any]:
    """Check every file of every zoo model against MANIFEST.json; return the manifest.

    Raises ZooError naming the first missing or corrupted file and the rebuild command, so a
    broken checkout fails before a vLLM server spends a minute starting on it.
    """
    _check_files(models_dir, NAMES)
    return manifest(models_dir)


def zoo_path(name: str, *, verify: bool = True, models_dir: Path = MODELS_DIR) -> Path:
    """Directory of zoo model ``name`` (one of NAMES), checked against the manifest by default."""
    if name not in NAMES:
        raise ZooError(f"unknown zoo model {name!r}; known: {', '.join(NAMES)}")
    if verify:
        _check_files(models_dir, (name,))
    return models_dir / name
