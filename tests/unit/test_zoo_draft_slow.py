"""Each speed-only variant of zoo:draft gives the draft's logits, only slower: a slow draft
(zoo:draft-slow and its smaller siblings) appends layers that add exactly zero, a wide draft
(zoo:draft-wide2048) widens the MLP with units that add exactly zero.

They are the zoo's pure timing regressions (`--specdec-draft draft_model=zoo:draft-slow`): acceptance
must not move, so any difference in outputs would make them a different regression.

A slow draft's logits are bit-identical (x + 0 is exact). A wide draft's are equal only to rounding:
the down projection sums 2048 products instead of 512, and a CPU's BLAS may block that longer sum
differently (an Intel Xeon's rounded it up to 3.8e-6 apart), so its logits are held to WIDE_ATOL and its
greedy tokens to identity, which is what acceptance depends on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.zoo import MODELS_DIR, NAMES, manifest, verify_zoo, zoo_path

torch = pytest.importorskip("torch")
train = pytest.importorskip("pytest_specdec.zoo.train")
variants = pytest.importorskip("pytest_specdec.zoo.variants")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

# torch: the zoo's models loaded and run.
pytestmark = pytest.mark.slow

SLOW = list(variants.SLOW_DRAFTS)
WIDE = list(variants.WIDE_DRAFTS)
#: How far a wide draft's float32 logits may round from the draft's: 25x the 3.8e-6 measured on an
#: Intel Xeon, and far below the logits' scale (units of 1), so a real change to the weights still fails.
WIDE_ATOL = 1e-4

#: Token sequences from the zoo's own tokenizer range (vocab 2048; 0-5 are the specials).
SEQUENCES = [
    [0, 3, 1800, 17, 912, 40, 40, 40, 5, 1000],
    [0, 4, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271, 272, 273, 274, 275],
    [0] + list(range(100, 2048, 37)),
]


def _load(name: str) -> transformers.LlamaForCausalLM:
    model = transformers.LlamaForCausalLM.from_pretrained(zoo_path(name), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def draft() -> object:
    return _load("draft")


@pytest.fixture(scope="module", params=SLOW + WIDE)
def models(request: pytest.FixtureRequest, draft: object) -> tuple[object, object, float]:
    """The draft, the variant, and how far the variant's logits may round from the draft's."""
    torch.manual_seed(0)
    return draft, _load(request.param), WIDE_ATOL if request.param in WIDE else 0.0


def _same_logits(a: object, b: object, atol: float) -> bool:
    return bool(torch.equal(a, b)) if atol == 0.0 else bool(torch.allclose(a, b, rtol=0.0, atol=atol))


def _greedy(model: object, prompt: list[int], steps: int) -> tuple[list[int], list[object]]:
    """Greedy decoding with a KV cache, one token per forward pass (as vLLM drafts)."""
    ids = torch.tensor([prompt])
    tokens: list[int] = []
    logits: list[object] = []
    past = None
    with torch.no_grad():
        for _ in range(steps):
            out = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            last = out.logits[0, -1]
            logits.append(last)
            tokens.append(int(last.argmax()))
            ids = torch.tensor([[tokens[-1]]])
    return tokens, logits


def test_draft_slow_logits_are_the_drafts(models: tuple[object, object, float]) -> None:
    """Bit-identical for a slow draft; within WIDE_ATOL for a wide one."""
    draft, slow, atol = models
    with torch.no_grad():
        for seq in SEQUENCES:
            ids = torch.tensor([seq])
            a, b = draft(input_ids=ids).logits, slow(input_ids=ids).logits
            assert torch.isfinite(a).all()
            gap = (a - b).abs().max()
            assert _same_logits(a, b, atol), f"logits differ by up to {gap:.3g} (allowed {atol:g}) on {seq[:6]}..."


def test_draft_slow_greedy_generation_is_identical(models: tuple[object, object, float]) -> None:
    draft, slow, atol = models
    for seq in SEQUENCES[:2]:
        tok_a, log_a = _greedy(draft, seq, 32)
        tok_b, log_b = _greedy(slow, seq, 32)
        assert tok_a == tok_b
        assert all(_same_logits(x, y, atol) for x, y in zip(log_a, log_b, strict=True))


def test_a_changed_wide_draft_is_not_within_rounding(draft: object) -> None:
    """WIDE_ATOL cannot pass a real change: one zero unit of the wide draft's first MLP given a weight
    of 0.01 moves its logits well past it."""
    wide = _load(WIDE[0])
    with torch.no_grad():
        wide.model.layers[0].mlp.down_proj.weight[:, -1] = 0.01
        wide.model.layers[0].mlp.up_proj.weight[-1, :] = 0.01
        wide.model.layers[0].mlp.gate_proj.weight[-1, :] = 0.01
        ids = torch.tensor([SEQUENCES[0]])
        assert not _same_logits(draft(input_ids=ids).logits, wide(input_ids=ids).logits, WIDE_ATOL)


def test_slow_drafts_are_distinct_zoo_models() -> None:
    assert set(SLOW) <= set(NAMES) and set(WIDE) <= set(NAMES) and not set(SLOW) & set(WIDE)
    depths = sorted(variants.SLOW_DRAFTS.values())
    assert len(set(depths)) == len(depths) and depths[0] >= 1, variants.SLOW_DRAFTS


def _draft_and_variant(
    name: str, changed: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The draft's and the speed-only variant `name`'s configs and float16 weights, checked to differ in the
    config only by `changed` (depth for the slow drafts, MLP width for the wide ones)."""
    draft_dir, variant_dir = zoo_path("draft"), zoo_path(name)
    cfg_a = json.loads((draft_dir / "config.json").read_text())
    cfg_b = json.loads((variant_dir / "config.json").read_text())
    assert {k: v for k, v in cfg_b.items() if k != changed} == {k: v for k, v in cfg_a.items() if k != changed}
    a = safetensors_torch.load_file(str(draft_dir / "model.safetensors"))
    b = safetensors_torch.load_file(str(variant_dir / "model.safetensors"))
    assert all(t.dtype == torch.float16 for t in b.values())
    return cfg_a, cfg_b, a, b


@pytest.mark.parametrize("name", SLOW)
def test_draft_slow_is_deeper_with_zero_output_extra_layers(name: str) -> None:
    # Only the depth differs: same width, vocab, dtype, rope, norms.
    cfg_a, cfg_b, a, b = _draft_and_variant(name, "num_hidden_layers")
    base, total = cfg_a["num_hidden_layers"], cfg_b["num_hidden_layers"]
    assert total == base + variants.SLOW_DRAFTS[name]
    for name, tensor in a.items():  # the draft's own weights are carried over unchanged
        assert torch.equal(b[name], tensor), name
    layer0 = sorted(k.split(".", 3)[3] for k in a if k.startswith("model.layers.0."))
    extra = set(b) - set(a)
    assert extra == {f"model.layers.{i}.{w}" for i in range(base, total) for w in layer0}
    zeroed = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
    for i in range(base, total):
        for w in layer0:
            t = b[f"model.layers.{i}.{w}"]
            if w in zeroed:
                assert not t.any(), f"layer {i} {w} is not all zeros"
            else:  # real weights, so the layer's attention and MLP do real work
                assert t.any() and torch.isfinite(t).all(), f"layer {i} {w} is empty"


@pytest.mark.parametrize("name", SLOW)
def test_draft_slow_is_in_the_verified_manifest(name: str) -> None:
    data = verify_zoo()
    files = {rel for rel in data["files"] if rel.startswith(f"{name}/")}
    shipped = {f"{name}/{p.name}" for p in zoo_path(name).iterdir() if p.is_file()}
    assert files == shipped and f"{name}/model.safetensors" in files
    assert data["total_bytes"] == sum(f["size"] for f in data["files"].values())
    entry = manifest()["slow_drafts"][name]
    depth = json.loads((zoo_path(name) / "config.json").read_text())["num_hidden_layers"]
    assert entry["draft_layers"] + entry["extra_layers"] == depth
    assert entry["extra_layers"] == variants.SLOW_DRAFTS[name]
    assert entry["command"] == f"python -m pytest_specdec.zoo.train --only {name}"
    assert entry["source_sha256"] == data["files"]["draft/model.safetensors"]["sha256"]
    for rel in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert data["files"][f"{name}/{rel}"] == data["files"][f"draft/{rel}"]


@pytest.mark.parametrize("name", WIDE)
def test_draft_wide_only_widens_the_mlp_with_zero_units(name: str) -> None:
    cfg_a, cfg_b, a, b = _draft_and_variant(name, "intermediate_size")
    base, width = cfg_a["intermediate_size"], cfg_b["intermediate_size"]
    assert width == variants.WIDE_DRAFTS[name] > base
    assert set(b) == set(a)
    widened = {f"model.layers.{i}.{w}" for i in range(cfg_a["num_hidden_layers"]) for w in variants.WIDENED}
    for key, tensor in a.items():
        if key not in widened:
            assert torch.equal(b[key], tensor), key
            continue
        axis = variants.WIDENED[key.split(".", 3)[3]]
        assert b[key].shape[axis] == width and b[key].shape[1 - axis] == tensor.shape[1 - axis], key
        own, extra = b[key].split([base, width - base], dim=axis)
        assert torch.equal(own, tensor), f"{key}: the draft's own units changed"
        assert not extra.any(), f"{key}: the {width - base} new units are not all zeros"


@pytest.mark.parametrize("name", WIDE)
def test_draft_wide_is_in_the_verified_manifest(name: str) -> None:
    data = verify_zoo()
    files = {rel for rel in data["files"] if rel.startswith(f"{name}/")}
    assert files == {f"{name}/{p.name}" for p in zoo_path(name).iterdir() if p.is_file()}
    entry = data["wide_drafts"][name]
    width = json.loads((zoo_path(name) / "config.json").read_text())["intermediate_size"]
    assert entry["intermediate_size"] == width == variants.WIDE_DRAFTS[name]
    assert entry["zero_units"] == width - entry["draft_intermediate_size"] > 0
    assert entry["command"] == f"python -m pytest_specdec.zoo.train --only {name}"
    assert entry["source_sha256"] == data["files"]["draft/model.safetensors"]["sha256"]
    assert variants.WIDE_COST[name] in data["models"][name]  # the measured cost, with its model
    for rel in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert data["files"][f"{name}/{rel}"] == data["files"][f"draft/{rel}"]


def test_a_wide_draft_no_wider_than_the_draft_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="width must exceed the draft's intermediate_size 512, got 512"):
        variants.build_wide_draft(WIDE[0], zoo_path("draft"), tmp_path / "w", 512)
    assert not (tmp_path / "w").exists()


def test_rebuild_reproduces_the_shipped_slow_drafts_and_manifest(tmp_path: Path) -> None:
    """`--only` with every speed-only variant, on a copy of the zoo, gives back the shipped files and
    MANIFEST.json byte for byte: the shipped ones are what the documented command writes."""
    copy = tmp_path / "models"
    shutil.copytree(MODELS_DIR, copy)
    for name in SLOW + WIDE:
        shutil.rmtree(copy / name)
    assert train.main(["--out", str(copy), "--only", *SLOW, *WIDE]) == 0
    for name in SLOW + WIDE:
        for p in sorted(zoo_path(name).iterdir()):
            assert (copy / name / p.name).read_bytes() == p.read_bytes(), f"{name}/{p.name}"
    assert (copy / "MANIFEST.json").read_text() == (MODELS_DIR / "MANIFEST.json").read_text()
    verify_zoo(copy)


@pytest.mark.parametrize(("args", "error"), [
    ([*SLOW[:2], "--extra-layers", "3"], "--extra-layers needs --only with exactly one slow draft"),
    ([WIDE[0], "--extra-layers", "3"], "--extra-layers needs --only with exactly one slow draft"),
    ([SLOW[0], "--width", "1024"], "--width needs --only with exactly one wide draft"),
])
def test_a_size_flag_needs_exactly_one_draft_of_its_kind(capsys: pytest.CaptureFixture[str],
                                                         args: list[str], error: str) -> None:
    with pytest.raises(SystemExit):
        train.main(["--only", *args])
    assert error in capsys.readouterr().err
