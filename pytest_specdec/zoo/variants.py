"""The speed-only variants of the zoo's draft: ``python -m pytest_specdec.zoo.train --only NAME``.

Why they exist: a benchmark must catch a draft that drafts the same tokens more slowly, so each
variant gives the draft's logits bit for bit (acceptance unchanged) at a known extra cost.  The slow
drafts append decoder layers that add exactly zero; the wide drafts widen the draft's MLP with units
that add exactly zero, a smaller step than one layer.  No training: each is derived from the shipped
draft in a second (docs/cpu-default.md, "How the zoo is trained", stages 7 and 8).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from pytest_specdec.zoo import NAMES, REBUILD_COMMAND, sha256_file
from pytest_specdec.zoo.store import TOKENIZER_FILES, clear_model_dir, log, save_safetensors, write_manifest

__all__ = ["SLOW_DRAFTS", "WIDENED", "WIDE_COST", "WIDE_DRAFTS", "build_slow_draft", "build_wide_draft",
           "rebuild_variants", "slow_draft_description", "wide_draft_description"]


#: The slow drafts: zoo name -> zero-output layers appended to the draft.  Each gives the draft's
#: tokens at a known extra drafting cost, so the gate's power can be shown at a large and at
#: realistic effects: on real vLLM (k=3, c=1, T=0) about -40 %, -10 % and -20 % spec tok/s
#: (docs/cpu-default.md, "The slow drafts measured").  One layer is the smallest step this
#: construction has; each costs 1.31 MB (float16).
SLOW_DRAFTS = {"draft-slow": 4, "draft-slow10": 1, "draft-slow20": 2}
#: The wide drafts: zoo name -> the MLP width (``intermediate_size``) of a draft whose units past
#: the draft's own are zero.  A step smaller than one zero layer (about -19 % spec tok/s in
#: ``test_methods[draft_model]``), aimed at -10 % there (2048 units timed at about half a layer's
#: forward pass in transformers); ``WIDE_COST`` is what vLLM measured (docs/cpu-default.md,
#: "The wide draft measured").
WIDE_DRAFTS = {"draft-wide2048": 2048}
#: Each wide draft's measured cost at its default width, for its MANIFEST.json description.
WIDE_COST = {"draft-wide2048": (
    "-12.4 % (95 % CI -15.0 .. -9.7 %) and -17.4 % (CI -21.5 .. -13.1 %) spec tok/s, acceptance "
    "unchanged, in two A/B sessions against the draft in test_methods[draft_model] on a quiet 2-core "
    "machine (docs/cpu-default.md, \"The wide draft measured\")")}


def load_draft(draft_dir: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The draft's config and float16 weights, the source of every speed-only variant."""
    from safetensors.torch import load_file

    cfg = json.loads((draft_dir / "config.json").read_text(encoding="utf-8"))
    state = load_file(str(draft_dir / "model.safetensors"))
    if any(v.dtype != torch.float16 for v in state.values()):
        raise ValueError(f"{draft_dir} is not stored as float16")
    return cfg, state


def write_variant(cfg: dict[str, Any], state: dict[str, torch.Tensor], draft_dir: Path,
                  out_dir: Path) -> None:
    """Write a variant of the draft to ``out_dir`` (replacing a zoo folder only): its config and
    weights, and the draft's tokenizer files, so it tokenizes exactly as the draft does."""
    clear_model_dir(out_dir)
    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_safetensors(state, out_dir / "model.safetensors")
    for file in TOKENIZER_FILES:
        shutil.copy(draft_dir / file, out_dir / file)


def build_slow_draft(name: str, draft_dir: Path, out_dir: Path,
                     extra_layers: int | None = None) -> dict[str, Any]:
    """Write slow draft ``name``: the draft plus ``extra_layers`` decoder layers that add exactly zero.

    Each appended layer is a copy of the draft's layer 0 (norms, q/k/v, gate/up: real, finite
    weights, so the kernels do the same work as in a trained layer) with ``self_attn.o_proj`` and
    ``mlp.down_proj`` set to zero: both branches of the layer then return exact zeros, the residual
    stream passes through unchanged, and the logits equal the draft's bit for bit.  The config only
    changes ``num_hidden_layers``; dtype (float16) and tokenizer files are the draft's.
    ``extra_layers`` defaults to ``SLOW_DRAFTS[name]``.  Returns its MANIFEST.json ``slow_drafts`` entry.
    """
    if name not in SLOW_DRAFTS:
        raise ValueError(f"unknown slow draft {name!r}; known: {', '.join(SLOW_DRAFTS)}")
    if extra_layers is None:
        extra_layers = SLOW_DRAFTS[name]
    if extra_layers < 1:
        raise ValueError(f"extra_layers must be >= 1, got {extra_layers}")
    cfg, state = load_draft(draft_dir)
    layers = int(cfg["num_hidden_layers"])
    prefix = "model.layers.0."
    layer0 = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    zeroed = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
    missing = [z for z in zeroed if z not in layer0]
    if missing:
        raise ValueError(f"{draft_dir} layer 0 has no {', '.join(missing)}")
    for i in range(layers, layers + extra_layers):
        for key, weight in layer0.items():
            state[f"model.layers.{i}.{key}"] = (torch.zeros_like(weight) if key in zeroed
                                                else weight.clone())
    cfg["num_hidden_layers"] = layers + extra_layers
    write_variant(cfg, state, draft_dir, out_dir)
    return {
        "source": "draft",
        "source_sha256": sha256_file(draft_dir / "model.safetensors"),
        "draft_layers": layers,
        "extra_layers": extra_layers,
        "num_hidden_layers": layers + extra_layers,
        "zeroed": [f"model.layers.{layers}..{layers + extra_layers - 1}.{z}" for z in zeroed],
        "command": f"{REBUILD_COMMAND} --only {name}"
                   + ("" if extra_layers == SLOW_DRAFTS[name] else f" --extra-layers {extra_layers}"),
    }


def slow_draft_description(extra_layers: int) -> str:
    copies = "copy" if extra_layers == 1 else "copies"
    return (f"Pure timing regression: the draft plus {extra_layers} appended {copies} of its layer "
            "with self_attn.o_proj and mlp.down_proj zeroed (each adds exactly zero), so outputs "
            "and acceptance equal the draft's and only the drafting cost grows")


#: The MLP weights a wide draft grows, and the axis each grows along (rows: units out; columns: in).
WIDENED = {"mlp.gate_proj.weight": 0, "mlp.up_proj.weight": 0, "mlp.down_proj.weight": 1}


def build_wide_draft(name: str, draft_dir: Path, out_dir: Path,
                     width: int | None = None) -> dict[str, Any]:
    """Write wide draft ``name``: the draft with its MLP widened to ``width`` units, the new ones zero.

    One zero layer (a slow draft) is too coarse a step for a -10 % regression, and a Llama config has
    no per-layer width, so the draft's own layers grow instead: zero rows of ``gate_proj`` and
    ``up_proj`` make the new units silu(0) * 0 = 0, and zero columns of ``down_proj`` add them to
    the residual stream as exact zeros, so the logits equal the draft's (checked bit for bit by
    tests/unit/test_zoo_draft_slow.py) while every MLP matmul does ``width / intermediate_size``
    times the work.  The config only changes ``intermediate_size``.  ``width`` defaults to
    ``WIDE_DRAFTS[name]``.  Returns its MANIFEST.json ``wide_drafts`` entry.
    """
    if name not in WIDE_DRAFTS:
        raise ValueError(f"unknown wide draft {name!r}; known: {', '.join(WIDE_DRAFTS)}")
    if width is None:
        width = WIDE_DRAFTS[name]
    cfg, state = load_draft(draft_dir)
    base, layers = int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    if width <= base:
        raise ValueError(f"width must exceed the draft's intermediate_size {base}, got {width}")
    for i in range(layers):
        for key, axis in WIDENED.items():
            full = f"model.layers.{i}.{key}"
            if full not in state:
                raise ValueError(f"{draft_dir} has no {full}")
            weight = state[full]
            pad = list(weight.shape)
            pad[axis] = width - base
            state[full] = torch.cat([weight, weight.new_zeros(pad)], dim=axis)
    cfg["intermediate_size"] = width
    write_variant(cfg, state, draft_dir, out_dir)
    units = {0: f"[{base}:{width}, :]", 1: f"[:, {base}:{width}]"}
    return {
        "source": "draft",
        "source_sha256": sha256_file(draft_dir / "model.safetensors"),
        "draft_intermediate_size": base,
        "intermediate_size": width,
        "zero_units": width - base,
        "zeroed": [f"model.layers.0..{layers - 1}.{key}{units[axis]}" for key, axis in WIDENED.items()],
        "command": f"{REBUILD_COMMAND} --only {name}"
                   + ("" if width == WIDE_DRAFTS[name] else f" --width {width}"),
    }


def wide_draft_description(name: str, entry: dict[str, Any]) -> str:
    width, base = entry["intermediate_size"], entry["draft_intermediate_size"]
    cost = (f"; its cost: {WIDE_COST[name]}" if width == WIDE_DRAFTS[name] else
            f"; width {width} is not the measured {WIDE_DRAFTS[name]}, its cost is unmeasured")
    return (f"Pure timing regression: the draft with its MLP widened from {base} to {width} units, the "
            f"{width - base} new ones zero (rows of gate_proj and up_proj, columns of down_proj: each "
            "adds exactly zero), so outputs and acceptance equal the draft's and only the drafting "
            f"cost grows{cost}")


def rebuild_variants(out: Path, layers: dict[str, int | None], widths: dict[str, int | None]) -> int:
    """``--only NAME ...``: derive these speed-only variants from the zoo in ``out`` and update its
    manifest.

    Every other model is checked against the existing MANIFEST.json first, so rewriting the manifest
    never records the sums of a corrupted file.  ``layers`` maps a slow draft to its extra layers,
    ``widths`` a wide draft to its MLP width (None: the ``SLOW_DRAFTS`` / ``WIDE_DRAFTS`` default).
    """
    from pytest_specdec.zoo import manifest, zoo_path

    old = manifest(out)
    for name in NAMES:
        if name not in layers and name not in widths:
            zoo_path(name, models_dir=out)
    info = {k: v for k, v in old.items() if k not in ("files", "total_bytes")}
    info["models"] = dict(info.get("models", {}))
    info["slow_drafts"] = dict(info.get("slow_drafts", {}))
    info["wide_drafts"] = dict(info.get("wide_drafts", {}))
    for name, extra in layers.items():
        t0 = time.monotonic()
        entry = build_slow_draft(name, out / "draft", out / name, extra)
        info["models"][name] = slow_draft_description(entry["extra_layers"])
        info["slow_drafts"][name] = entry
        log(f"{name} ({entry['num_hidden_layers']} layers) in {time.monotonic() - t0:.1f}s -> "
            f"{out / name}")
    for name, width in widths.items():
        t0 = time.monotonic()
        entry = build_wide_draft(name, out / "draft", out / name, width)
        info["models"][name] = wide_draft_description(name, entry)
        info["wide_drafts"][name] = entry
        log(f"{name} (MLP {entry['intermediate_size']}) in {time.monotonic() - t0:.1f}s -> {out / name}")
    write_manifest(out, info)
    return 0
