"""Synthetic prompts of exact token lengths, as vllm bench serve's random dataset makes them."""

from __future__ import annotations

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.datasets.synthetic import length_bounds, synthetic, synthetic_prompts


class WordTokenizer:
    """The HF tokenizer calls the maker uses, one word per token: decode and re-encode always agree."""

    vocab_size = 500
    all_special_ids = [0, 1]

    def __init__(self, special: int = 1) -> None:
        self.special = special

    def num_special_tokens_to_add(self) -> int:
        return self.special

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        assert not add_special_tokens
        return [int(w[1:]) for w in text.split()]


def test_exact_lengths_with_range_ratio_zero() -> None:
    prompts, missed = synthetic_prompts(WordTokenizer(), 6, input_len=20, output_len=8)
    assert missed == 0
    # the server adds its one special token: 19 tokens of text, 20 counted
    assert [p.input_tokens for p in prompts] == [20] * 6 and {p.max_tokens for p in prompts} == {8}
    assert all(len(p.prompt.split()) == 19  # type: ignore[union-attr]  # prompt: str | None, set on these
               and p.category == "random" for p in prompts)
    # no special ids in the text
    assert all(0 not in WordTokenizer().encode(p.prompt) for p in prompts)  # type: ignore[arg-type]  # prompt is set


def test_lengths_within_the_range_and_deterministic_per_seed() -> None:
    tok = WordTokenizer(special=0)
    prompts, _ = synthetic_prompts(tok, 40, input_len=100, output_len=50, range_ratio=0.3, seed=7)
    ins, outs = [p.input_tokens for p in prompts], [p.max_tokens for p in prompts]
    assert (all(70 <= n <= 130 for n in ins)  # type: ignore[operator]  # input_tokens: int | None, set here
            and all(35 <= n <= 65 for n in outs))
    assert len(set(ins)) > 10 and len(set(outs)) > 10
    again, _ = synthetic_prompts(tok, 40, input_len=100, output_len=50, range_ratio=0.3, seed=7)
    other, _ = synthetic_prompts(tok, 40, input_len=100, output_len=50, range_ratio=0.3, seed=8)
    assert again == prompts != other


def test_bounds_and_too_short_an_input() -> None:
    assert length_bounds(101, 10, 0.5, num_special=1) == (50, 150, 5, 15)
    with pytest.raises(ConfigError, match="input_len=1 is too small"):
        length_bounds(1, 10, 0.0, num_special=1)


def test_no_tokenizer_is_an_error_naming_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.measure import tokens

    monkeypatch.setattr(tokens, "load", lambda model: tokens.Tokenizer(model, why="transformers is not installed"))
    with pytest.raises(ConfigError, match="input_len/output_len .* cannot be loaded for org/target: transformers"):
        synthetic("org/target", 4, 32, 8)


@pytest.mark.slow  # the target's tokenizer through transformers imports torch
def test_zoo_target_lengths_exact_and_recorded_truthfully() -> None:
    from pytest_specdec.measure.tokens import load
    from pytest_specdec.zoo import zoo_path

    tok = load(str(zoo_path("target"))).hf
    prompts, missed = synthetic_prompts(tok, 8, input_len=48, output_len=16)
    assert missed == 0 and [p.input_tokens for p in prompts] == [48] * 8
    assert [len(tok(p.prompt).input_ids) for p in prompts] == [48] * 8  # as the server counts them
    ranged, _ = synthetic_prompts(tok, 16, input_len=64, output_len=16, range_ratio=0.5)
    assert all(p.input_tokens == len(tok(p.prompt).input_ids) for p in ranged)  # a missed length is its real one
    assert all(32 <= p.input_tokens <= 96  # type: ignore[operator]  # input_tokens: int | None, set on these
               and 8 <= p.max_tokens <= 24 for p in ranged)
    assert synthetic_prompts(tok, 16, input_len=64, output_len=16, range_ratio=0.5)[0] == ranged
