"""Token counts by the target's tokenizer: the prompts' input tokens as the server counts them
(`measure/counting.py`), output lengths estimated from reference answers (`datasets.load_file`), and the
characters / 4 fallback with its reason wherever no tokenizer can be loaded. A stub tokenizer (one token a
word, BOS when special tokens are added) stands in for a real one, which would import torch."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_specdec.measure import counting, tokens
from pytest_specdec.measure.datasets import BUILTIN, InputCounts, builtin, estimate_tokens, load_file
from pytest_specdec.measure.tokens import Tokenizer
from pytest_specdec.measure.types import Prompt


class _Words:
    """A tokenizer whose tokens are words, BOS added with special tokens, and a chat template that wraps
    each message in role markers and adds the assistant's prompt."""

    def __init__(self, template: bool = True) -> None:
        self.chat_template = "{{ messages }}" if template else None
        self.rendered: list[str] = []

    def __call__(self, text: str, add_special_tokens: bool = True) -> Any:
        return SimpleNamespace(input_ids=["<s>"] * add_special_tokens + text.split())

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool, add_generation_prompt: bool) -> str:
        assert not tokenize and add_generation_prompt  # vLLM renders to text, then tokenizes it
        text = "<s> " + " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"
        self.rendered.append(text)
        return text


CHAT = Prompt(id="c", messages=[{"role": "user", "content": "one two three"}], max_tokens=8, category="qa")
TEXT = Prompt(id="t", prompt="one two three four five", max_tokens=8, category="code")


def test_input_tokens_are_counted_as_the_server_counts_them() -> None:
    """Chat: the template applied with the generation prompt, its text tokenized without adding special tokens
    (the template holds BOS); completions: with special tokens unless the request says add_special_tokens
    false (a prompt rendered from the chat template)."""
    hf = _Words()
    rendered = Prompt(id="r", prompt="<s> <user> hi <assistant>", max_tokens=8, add_special_tokens=False)
    n, how = counting.count(Tokenizer("m", hf=hf), [CHAT, TEXT, rendered])
    assert how == "tokenizer"
    assert n == [1 + 1 + 3 + 1, 1 + 5, 4]  # <s> <user> 3 words <assistant>; BOS + 5 words; as rendered
    assert [counting.counted(p, c, how).input_tokens for p, c in zip([CHAT, TEXT], n[:2], strict=True)] == [6, 6]


def test_without_a_tokenizer_the_estimate_is_said_with_its_reason_and_never_set_on_the_prompt() -> None:
    n, how = counting.count(Tokenizer("m", why="the tokenizer of m could not be loaded: gone"), [CHAT, TEXT])
    assert n == [4, 6]  # ceil(13 / 4), ceil(23 / 4) of the text sent
    assert how == "characters / 4 (the tokenizer of m could not be loaded: gone)"
    assert counting.counted(CHAT, n[0], how).input_tokens is None  # a limit is not judged on a guess
    no_template = Tokenizer("m", hf=_Words(template=False))
    n, how = counting.count(no_template, [CHAT])
    assert (n, how) == ([4], "characters / 4 (the tokenizer of m has no chat template to render the chat prompts "
                              "with)")
    assert counting.count(no_template, [TEXT]) == ([6], "tokenizer")  # completions need no template


def test_a_model_without_local_files_is_said_before_transformers_is_imported(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    tok = tokens.load("no-such-org/no-such-model-for-counting")
    assert tok.hf is None
    assert tok.source == (f"characters / 4 (the tokenizer of no-such-org/no-such-model-for-counting could not be "
                          f"loaded: no such folder, and not in the Hugging Face cache {tmp_path})")
    assert tok.count("12345") == 2
    (tmp_path / "models--org--cached").mkdir()
    assert tokens._not_local("org/cached") == ""  # in the cache: transformers is asked


def _sharegpt(tmp_path: Path) -> Path:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": " ".join(["w"] * 40)}]},
        {"id": "b", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "x" * 400}]},
    ]))
    return path


def test_output_lengths_from_reference_answers_are_the_tokenizers_count_and_the_identity_says_so(
        tmp_path: Path) -> None:
    path = _sharegpt(tmp_path)
    loads: list[int] = []

    def words() -> Tokenizer:
        loads.append(1)
        return Tokenizer("m", hf=_Words())

    counted = load_file(path, tokenizer=words)
    assert [p.max_tokens for p in counted.prompts] == [40, 16]  # 40 words; one word, clamped up to 16
    assert loads == [1]  # loaded once, at the first reference answer
    estimated = load_file(path, tokenizer=lambda: Tokenizer("m", why="gone"))
    assert [p.max_tokens for p in estimated.prompts] == [estimate_tokens("w " * 39 + "w"), 100]
    assert counted.describe()["output_lengths"]["counted"] == "tokenizer"
    assert estimated.describe()["output_lengths"]["counted"] == "characters / 4 (gone)"
    assert "counted by characters / 4 (gone)" in estimated.summary()
    assert counted.identity()["output_lengths_counted"] == "tokenizer"
    assert estimated.identity()["output_lengths_counted"] == "characters / 4"  # the reason is the machine's
    assert load_file(path).identity() == estimated.identity()  # no tokenizer asked for: the estimate, as before
    assert estimate_tokens("a b c d e f g h i j k l m n o p q", lambda t: len(t.split())) == 17


def test_a_file_without_reference_answers_never_loads_the_tokenizer() -> None:
    def refuse() -> Tokenizer:
        raise AssertionError("loaded the tokenizer for given lengths")

    ds = load_file(BUILTIN, "prompts", name="builtin", tokenizer=refuse)
    assert "output_lengths_counted" not in ds.identity() and ds.identity() == builtin().identity()


def test_input_counts_by_category() -> None:
    counts = InputCounts()
    counts.add("tokenizer", [CHAT, TEXT, Prompt(id="c2", prompt="x", max_tokens=32, category="qa")], [6, 6, 3])
    counts.add("tokenizer", [CHAT], [6])  # counted again (another test): once
    assert counts.source == "tokenizer"
    assert counts.by_category() == {
        "code": {"prompts": 1, "input_tokens_mean": 6.0, "input_tokens_min": 6, "input_tokens_max": 6,
                 "max_tokens_max": 8},
        "qa": {"prompts": 2, "input_tokens_mean": 4.5, "input_tokens_min": 3, "input_tokens_max": 6,
               "max_tokens_max": 32},
    }
    counts.add("characters / 4 (why)", [TEXT], [6])
    assert counts.source == "tokenizer; characters / 4 (why)"  # two ways of counting, both said


def test_a_prompt_sent_again_keeps_the_most_max_tokens() -> None:
    counts = InputCounts()
    counts.add("tokenizer", [TEXT], [6])
    counts.add("tokenizer", [Prompt(id="t", prompt="one two three four five", max_tokens=64, category="code")], [6])
    counts.add("tokenizer", [TEXT], [6])
    assert counts.by_category()["code"]["max_tokens_max"] == 64 and counts.by_category()["code"]["prompts"] == 1
