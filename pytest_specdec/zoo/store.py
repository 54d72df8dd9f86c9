"""Writing the zoo's model folders and its MANIFEST.json, shared by the trainer and the variants.

Why a module of its own: ``train.py`` writes the trained models and ``variants.py`` the speed-only
variants derived from the draft; both must refuse to replace a folder they did not write, store
float16 safetensors the same way and record every file's sha256 in one manifest.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from pytest_specdec.zoo import NAMES, sha256_file

__all__ = ["MODEL_FILES", "TOKENIZER_FILES", "clear_model_dir", "default_out", "log", "replaceable",
           "save_safetensors", "write_manifest"]


def log(msg: str) -> None:
    print(f"[zoo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def save_safetensors(state: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in sorted(state.items())}
    save_file(tensors, str(path), metadata={"format": "pt"})
    path.chmod(0o644)


#: Every file a zoo model folder holds: a folder with anything else was not written here.
MODEL_FILES = frozenset({"config.json", "model.safetensors", "generation_config.json", *TOKENIZER_FILES})


def replaceable(path: Path) -> None:
    """Refuse to replace a folder this trainer did not write: `--out` may point anywhere, and a
    folder named like a zoo model there may hold someone's work."""
    if not path.exists() and not path.is_symlink():
        return
    names = {p.name for p in path.iterdir()} if path.is_dir() and not path.is_symlink() else set()
    if "config.json" not in names or not names <= MODEL_FILES:
        raise SystemExit(f"{path} exists and is not a zoo model folder (a config.json and only "
                         f"{', '.join(sorted(MODEL_FILES))}); move it away or choose another --out")


def clear_model_dir(path: Path) -> None:
    """Remove a zoo model folder before it is written anew (checked by `replaceable` first)."""
    replaceable(path)
    if path.exists():
        shutil.rmtree(path)


def write_manifest(out: Path, info: dict[str, Any]) -> None:
    files: dict[str, dict[str, Any]] = {}
    for name in NAMES:
        for p in sorted((out / name).iterdir()):
            if p.is_file():
                files[f"{name}/{p.name}"] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    info = dict(info, files=files,
                total_bytes=sum(f["size"] for f in files.values()))
    (out / "MANIFEST.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def default_out() -> Path:
    return Path(__file__).resolve().parent / "models"
