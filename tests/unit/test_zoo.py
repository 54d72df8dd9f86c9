"""The shipped zoo: intact, small, and a broken file is named with the command that rebuilds it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_specdec.zoo import MODELS_DIR, NAMES, REBUILD_COMMAND, ZooError, verify_zoo, zoo_path


def test_shipped_zoo_matches_its_manifest_and_fits_the_budget() -> None:
    manifest = verify_zoo()
    assert set(NAMES) <= {rel.split("/", 1)[0] for rel in manifest["files"]}
    total = sum(p.stat().st_size for p in MODELS_DIR.rglob("*") if p.is_file())
    # 42 MiB: the models ship in every clone; the three slow drafts take 18.9 MiB of it, the wide draft
    # 5.6 MiB (3.0 MiB in git: its zero units compress).
    assert total <= 42 * 1024 * 1024, f"zoo is {total / 2**20:.1f} MiB, over the 42 MiB budget"
    eagle = json.loads((zoo_path("eagle3") / "config.json").read_text())
    # Small targets need explicit aux layers: vLLM's defaults collide for 4 layers.
    assert eagle["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]


@pytest.fixture
def zoo_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "models"
    shutil.copytree(MODELS_DIR, copy)
    return copy


def test_corrupted_file_is_named_with_the_rebuild_command(zoo_copy: Path) -> None:
    victim = zoo_copy / "eagle3" / "model.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ZooError) as info:
        verify_zoo(zoo_copy)
    assert str(victim) in str(info.value) and "corrupted" in str(info.value)
    assert REBUILD_COMMAND in str(info.value)


def test_missing_file_is_named_with_the_rebuild_command(zoo_copy: Path) -> None:
    victim = zoo_copy / "draft" / "config.json"
    victim.unlink()
    with pytest.raises(ZooError) as info:
        zoo_path("draft", models_dir=zoo_copy)
    assert f"zoo file {victim} is missing" in str(info.value)
    assert REBUILD_COMMAND in str(info.value)


def test_unknown_zoo_model_lists_the_known_ones() -> None:
    with pytest.raises(ZooError, match="unknown zoo model 'eagle1'; known: target, draft, eagle3, eagle3-degraded"):
        zoo_path("eagle1")


@pytest.mark.slow
def test_the_trainer_never_deletes_a_folder_it_did_not_write(tmp_path: Path) -> None:
    """`--out DIR` may point anywhere: a folder there named like a zoo model but holding anything else
    stops the trainer before any training, and is left as it was."""
    from pytest_specdec.zoo.train import clear_model_dir, main

    mine = tmp_path / "target"
    mine.mkdir()
    (mine / "thesis.tex").write_text("three years of work")
    with pytest.raises(SystemExit, match=r"target exists and is not a zoo model folder .*choose another --out"):
        main(["--out", str(tmp_path), "--quick"])
    assert (mine / "thesis.tex").read_text() == "three years of work"
    # A folder the trainer wrote (the shipped target's files) is replaced.
    ours = tmp_path / "draft"
    shutil.copytree(MODELS_DIR / "target", ours)
    clear_model_dir(ours)
    assert not ours.exists()


def eagle3_heads(models_dir: Path = MODELS_DIR) -> dict[str, dict[str, object]]:
    """Every zoo model whose config declares an EAGLE-3 architecture, by name: its parsed config."""
    configs = {name: json.loads((models_dir / name / "config.json").read_text()) for name in NAMES}
    return {name: cfg for name, cfg in configs.items()
            if any("Eagle3" in arch for arch in cfg.get("architectures", []))}


def aux_layer_mismatches(heads: dict[str, dict[str, object]]) -> list[str]:
    """The heads whose two declarations of the aux layer ids are missing or differ, worded."""
    wrong = []
    for name, cfg in sorted(heads.items()):
        nested = cfg.get("eagle_config")
        top, inner = cfg.get("eagle_aux_hidden_state_layer_ids"), (
            nested.get("eagle_aux_hidden_state_layer_ids") if isinstance(nested, dict) else None)
        if not top or top != inner:
            wrong.append(f"{name}: top-level {top!r}, eagle_config {inner!r}")
    return wrong


def test_every_eagle3_head_declares_its_aux_layers_both_ways_and_equal() -> None:
    """CUDA vLLM 0.26.0's GPU model runner reads the top-level `eagle_aux_hidden_state_layer_ids`, vLLM's
    llama_eagle3 model sizes its fc from `eagle_config`'s: one missing and the head loads on one vLLM and
    fails its start on the other (a shape mismatch in combine_hidden_states)."""
    heads = eagle3_heads()
    assert set(heads) == {"eagle3", "eagle3-degraded"}
    assert aux_layer_mismatches(heads) == []


@pytest.mark.parametrize("drop", ["top-level", "eagle_config"])
def test_a_head_missing_one_declaration_is_named(zoo_copy: Path, drop: str) -> None:
    path = zoo_copy / "eagle3" / "config.json"
    cfg = json.loads(path.read_text())
    if drop == "top-level":
        del cfg["eagle_aux_hidden_state_layer_ids"]
    else:
        del cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    path.write_text(json.dumps(cfg))
    assert aux_layer_mismatches(eagle3_heads(zoo_copy)) == [
        "eagle3: top-level None, eagle_config [1, 2, 3]" if drop == "top-level"
        else "eagle3: top-level [1, 2, 3], eagle_config None"]


def test_a_twin_is_timed_beside_its_base_and_an_invalid_pair_is_named_not_averaged(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`zoo.measure`: a slow draft measured with its base goes through `measure_with_twins` (interleaved pairs,
    both servers up), never a server of its own; its speed is the pairs' geometric mean, an invalid pair kept
    and left out of it."""
    from pytest_specdec.zoo import measure as zoo_measure

    def pair(base: float, twin: float, invalid: list[str] | None = None) -> dict[str, object]:
        return {"first": "base", "base": {"output_tok_s": base, "invalid_reasons": []},
                "twin": {"output_tok_s": twin, "invalid_reasons": invalid or []}}

    alone: list[str] = []
    paired: list[tuple[str, tuple[str, ...]]] = []

    def measured(method: str, *_a: object, **_kw: object) -> zoo_measure.MethodResult:
        alone.append(method)
        return zoo_measure.MethodResult(method=method, startup_s=1.0)

    def with_twins(base: str, twins: tuple[str, ...], *_a: object,
                   **_kw: object) -> dict[str, zoo_measure.MethodResult]:
        paired.append((base, twins))
        pairs = [pair(100.0, 60.0), pair(100.0, 90.0, ["client lagged"]), pair(80.0, 60.0)]
        return {base: zoo_measure.MethodResult(method=base, startup_s=1.0),
                **{t: zoo_measure.MethodResult(method=t, startup_s=1.0, timing_pairs=pairs) for t in twins}}

    monkeypatch.setattr(zoo_measure, "measure_method", measured)
    monkeypatch.setattr(zoo_measure, "measure_with_twins", with_twins)
    summary = zoo_measure.measure(tmp_path, methods=("draft-slow", "none", "draft_model"), no_fix_method=None)
    assert alone == ["none"] and paired == [("draft_model", ("draft-slow",))]
    speed = summary["methods"]["draft-slow"]["speed_vs_twin"]
    assert speed["ratios"] == [0.6, None, 0.75] and speed["valid_pairs"] == 2 and speed["pairs"] == 3
    assert speed["geometric_mean"] == pytest.approx((0.6 * 0.75) ** 0.5)
    assert "draft-slow against draft_model" in zoo_measure.markdown(summary)
    # Without its base, a twin is measured alone, as before.
    alone.clear()
    zoo_measure.measure(tmp_path, methods=("draft-slow",), no_fix_method=None)
    assert alone == ["draft-slow"]
