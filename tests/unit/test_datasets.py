"""Datasets: the built-in prompt set, the file loaders (prompts JSONL, ShareGPT, spec_bench / MT-Bench,
InstructCoder) and their error messages (--specdec-dataset through the plugin:
tests/functional/test_datasets_session.py)."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.markers import Case
from pytest_specdec.measure.datasets import (
    BUILTIN,
    DEFAULT_OUTPUT_TOKENS,
    INSTRUCTCODER_SUFFIX,
    MAX_OUTPUT_TOKENS,
    MIN_OUTPUT_TOKENS,
    DatasetSpec,
    builtin,
    estimate_tokens,
    load,
    load_file,
)
from pytest_specdec.options import Settings
from pytest_specdec.session import SpecDecSession

CATEGORIES = {"short_qa", "summarization", "code_generation", "code_editing", "creative_writing", "translation",
              "structured_output", "reasoning"}
#: sha256 of the 32 prompts the zoo was measured with (README) and that zoo/measure.py still sends.
FIRST_32_SHA256 = "b626dd172c409349903ce3da1f716603db0bf510bd0f17a85f1d5a8c0dfc382a"
CPU_MAX_MODEL_LEN = 1024  # the cpu profile's --max-model-len


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, *records: Any) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


def user_text(p: Any) -> str:
    return "\n".join(m["content"] for m in p.messages if m["role"] == "user")


# --- the built-in set ----------------------------------------------------------------------------
def test_builtin_is_large_balanced_and_unique() -> None:
    ds = builtin()
    counts = Counter(p.category for p in ds.prompts)
    assert len(ds.prompts) >= 120
    assert set(counts) == CATEGORIES
    assert min(counts.values()) >= 12, counts
    assert len({p.id for p in ds.prompts}) == len(ds.prompts)
    assert ds.lengths == {"given": len(ds.prompts)}  # every built-in prompt states its output length


def test_builtin_keeps_the_original_32_first() -> None:
    lines = BUILTIN.read_bytes().splitlines(keepends=True)
    assert hashlib.sha256(b"".join(lines[:32])).hexdigest() == FIRST_32_SHA256


@pytest.mark.parametrize("category, low, high", [
    ("short_qa", 48, 192), ("translation", 64, 192), ("structured_output", 64, 384),
    ("summarization", 64, 256), ("code_generation", 128, 512), ("code_editing", 128, 384),
    ("creative_writing", 64, 512), ("reasoning", 128, 512),
])
def test_builtin_output_lengths_suit_the_category(category: str, low: int, high: int) -> None:
    tokens = [p.max_tokens for p in builtin().by_category(category)]
    assert all(low <= t <= high for t in tokens), (category, tokens)


def test_builtin_transform_prompts_carry_their_text() -> None:
    """Summarization and code editing include what they transform: that is where n-gram lookup finds overlap."""
    ds = builtin()
    for p in ds.by_category("code_editing"):
        assert "```" in user_text(p) and user_text(p).count("\n") >= 5, p.id
    for p in ds.by_category("summarization"):
        assert len(user_text(p)) >= 200, p.id
    lengths = sorted(len(user_text(p)) for p in ds.prompts)
    assert lengths[0] < 80 and lengths[-1] > 1200  # short questions and long documents


def test_builtin_fits_the_cpu_profile_context() -> None:
    """Prompt + max_tokens must fit the zoo's --max-model-len, or vLLM rejects the request."""
    tokenizers = pytest.importorskip("tokenizers")
    from pytest_specdec.zoo import MODELS_DIR

    tok = tokenizers.Tokenizer.from_file(str(MODELS_DIR / "target" / "tokenizer.json"))
    for p in builtin().prompts:
        prompt_tokens = sum(len(tok.encode(m["content"]).ids) + 8 for m in p.messages)  # + template per turn
        assert prompt_tokens + p.max_tokens <= CPU_MAX_MODEL_LEN - 64, (p.id, prompt_tokens, p.max_tokens)


# --- spec strings ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, path, fmt, cats", [
    ("builtin", "builtin", None, ()),
    ("builtin#code_editing", "builtin", None, ("code_editing",)),
    ("sharegpt:/data/sg.json#a, b", "/data/sg.json", "sharegpt", ("a", "b")),
    ("mt_bench:question.jsonl", "question.jsonl", "spec_bench", ()),
    ("jsonl:p.jsonl", "p.jsonl", "prompts", ()),
    ("C:\\data\\p.jsonl", "C:\\data\\p.jsonl", None, ()),  # a drive letter is not a format
])
def test_spec_parse(text: str, path: str, fmt: str | None, cats: tuple[str, ...]) -> None:
    spec = DatasetSpec.parse(text)
    assert (spec.path, spec.format, spec.categories) == (path, fmt, cats)
    assert DatasetSpec.parse(str(spec)) == spec


@pytest.mark.parametrize("text, message", [
    ("", "expected 'builtin' or [FORMAT:]PATH"),
    ("p.jsonl#", "expected #CATEGORY"),
    ("p.jsonl#a,,b", "expected #CATEGORY"),
    ("sharegpt:", "no path"),
    ("spec_bench:builtin", "the built-in set is in the prompts format"),
])
def test_spec_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        DatasetSpec.parse(text)


def test_estimate_rule() -> None:
    assert estimate_tokens("x" * 400) == 100
    assert estimate_tokens("x" * 401) == 101  # rounded up
    assert estimate_tokens("ok") == MIN_OUTPUT_TOKENS
    assert estimate_tokens("x" * 100_000) == MAX_OUTPUT_TOKENS


# --- loaders ------------------------------------------------------------------------------------------
def test_prompts_jsonl(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "p.jsonl",
        {"id": "a", "category": "qa", "messages": [{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": "Hi?"}], "max_tokens": 40},
        {"prompt": "What is 2+2?", "output_tokens": 12},  # vllm bench serve's custom JSONL
        {"id": 7, "prompt": "No length here"},
    )
    ds = load_file(path)
    assert ds.format == "prompts" and ds.name == "p.jsonl"
    a, b, c = ds.prompts
    assert (a.id, a.category, a.max_tokens, a.messages[0]["role"]) == ("a", "qa", 40, "system")
    assert (b.id, b.messages, b.max_tokens) == ("p-2", [{"role": "user", "content": "What is 2+2?"}], 12)
    assert (c.id, c.max_tokens) == ("7", DEFAULT_OUTPUT_TOKENS)
    assert ds.lengths == {"given": 2, "default": 1}
    assert "1 without a length got max_tokens=256" in ds.summary()


def test_prompts_as_a_json_array(tmp_path: Path) -> None:
    path = write(tmp_path / "p.json", json.dumps([{"prompt": "one", "max_tokens": 5}, {"prompt": "two"}]))
    ds = load_file(path)
    assert [p.id for p in ds.prompts] == ["p-0", "p-1"]


def test_sharegpt(tmp_path: Path) -> None:
    data = [
        {"id": "c1", "conversations": [{"from": "human", "value": "Explain DNS."},
                                       {"from": "gpt", "value": "x" * 400},
                                       {"from": "human", "value": "And DHCP?"}]},
        {"id": "c2", "conversations": [{"from": "system", "value": "You are kind."},
                                       {"from": "gpt", "value": "Hello! How can I help?"},
                                       {"from": "human", "value": "Write a poem."},
                                       {"from": "gpt", "value": "ok"}]},
        {"id": "c3", "conversations": [{"from": "human", "value": "Unanswered"}]},
        {"id": "c4", "conversations": []},
        {"id": "c5", "conversations": [{"from": "gpt", "value": "only the model spoke"}]},
        {"id": "c6", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "?"}]},
    ]
    ds = load_file(write(tmp_path / "sg.json", json.dumps(data)))
    assert ds.format == "sharegpt"
    by_id = {p.id: p for p in ds.prompts}
    assert list(by_id) == ["c1", "c2", "c3"]
    assert by_id["c1"].messages == [{"role": "user", "content": "Explain DNS."}] and by_id["c1"].max_tokens == 100
    assert by_id["c2"].messages == [{"role": "user", "content": "Write a poem."}]  # first human turn
    assert by_id["c2"].max_tokens == MIN_OUTPUT_TOKENS  # the reply after it, floored
    assert by_id["c3"].max_tokens == DEFAULT_OUTPUT_TOKENS  # no reply: the documented default
    assert ds.skipped == {"empty conversations": 1, "without a non-empty human turn": 2}
    assert ds.lengths == {"estimated": 2, "default": 1}
    assert ds.describe()["output_lengths"]["rule"].startswith("estimated from the reference answer")
    assert "skipped 1 empty conversations, 2 without a non-empty human turn" in ds.summary()


def test_spec_bench_and_category_filter(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "question.jsonl",
        {"question_id": 81, "category": "writing", "turns": ["Write a travel blog post.", "Rewrite it."]},
        {"question_id": 111, "category": "math", "turns": ["What is 3*7?"], "reference": ["21"]},
        {"question_id": 200, "category": "translation", "turns": ["Translate: Hallo"]},
    )
    ds = load_file(path)
    assert ds.format == "spec_bench"
    assert [(p.id, p.category, user_text(p), p.max_tokens) for p in ds.prompts] == [
        ("81", "writing", "Write a travel blog post.", DEFAULT_OUTPUT_TOKENS),
        ("111", "math", "What is 3*7?", DEFAULT_OUTPUT_TOKENS),  # the judge's reference is not an answer length
        ("200", "translation", "Translate: Hallo", DEFAULT_OUTPUT_TOKENS),
    ]
    only = load(f"mt_bench:{path}#writing,math", tmp_path)
    assert [p.id for p in only.prompts] == ["81", "111"] and only.name == "question.jsonl#writing,math"
    message = "no prompts of category 'qa'; categories in .*: math, translation, writing"
    with pytest.raises(ConfigError, match=message):
        load(f"{path}#qa", tmp_path)


@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_instructcoder(tmp_path: Path, suffix: str) -> None:
    records = [
        {"instruction": "Add a docstring.", "input": "def f(x):\n    return x", "output": "y" * 200},
        {"instruction": "Write a hello world program.", "input": "", "output": ""},
    ]
    text = "".join(json.dumps(r) + "\n" for r in records) if suffix == "jsonl" else json.dumps(records)
    ds = load_file(write(tmp_path / f"ic.{suffix}", text))
    assert ds.format == "instructcoder"
    a, b = ds.prompts
    assert user_text(a) == "def f(x):\n    return x\n\nAdd a docstring." + INSTRUCTCODER_SUFFIX  # as vllm bench serve
    assert a.max_tokens == 50 and a.category == "code_editing"
    assert user_text(b) == "Write a hello world program." + INSTRUCTCODER_SUFFIX
    assert b.max_tokens == DEFAULT_OUTPUT_TOKENS
    assert ds.lengths == {"estimated": 1, "default": 1}


def test_format_prefix_overrides_detection(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "both.jsonl", {"question_id": 1, "turns": ["from turns"], "prompt": "from prompt"})
    assert user_text(load(str(path), tmp_path).prompts[0]) == "from turns"  # detected: spec_bench
    forced = load(f"prompts:{path}", tmp_path)
    assert forced.format == "prompts" and user_text(forced.prompts[0]) == "from prompt"


def test_relative_paths_are_relative_to_the_root(tmp_path: Path) -> None:
    jsonl(tmp_path / "p.jsonl", {"prompt": "x"})
    assert load("p.jsonl", tmp_path).path == str(tmp_path / "p.jsonl")
    with pytest.raises(ConfigError, match=r"dataset 'nope.jsonl': no such file \(.*nope.jsonl\)"):
        load("nope.jsonl", tmp_path)


# --- malformed files: file, line or JSON path, and what was expected -------------------------------
MALFORMED = [
    pytest.param("p.jsonl", '{"prompt": "a"}\n\n{"prompt": "b"\n',
                 r"p.jsonl:3: not valid JSON \(Expecting ',' delimiter at column 15\); "
                 r"expected one JSON object per line",
                 id="jsonl-syntax"),
    pytest.param("p.jsonl", '{"prompt": "a"}\n{"prompt": "b", "max_tokens": "ten"}\n',
                 r"p.jsonl:2: max_tokens: expected a whole number from 1 to 1048576, got str 'ten' "
                 r"\(reading the file as prompts",
                 id="jsonl-max-tokens"),
    pytest.param("p.jsonl", '{"prompt": "a", "max_tokens": 0}\n',
                 r"p.jsonl:1: max_tokens: expected a whole number from 1 to 1048576, got int 0", id="jsonl-zero"),
    pytest.param("p.jsonl", '{"prompt": "a", "output_tokens": 100000000}\n',
                 r"p.jsonl:1: output_tokens: expected a whole number from 1 to 1048576, got int 100000000",
                 id="jsonl-huge"),
    pytest.param("p.jsonl", '{"prompt": "a", "messages": []}\n',
                 r'p.jsonl:1: messages: expected exactly one of "messages" \(chat\) or "prompt" \(the user turn\), '
                 r"got both \(", id="both"),
    pytest.param("p.jsonl", '{"prompt": "a"}\n{"messages": [{"role": "human", "content": "x"}]}\n',
                 r"p.jsonl:2: messages\[0\].role: expected one of assistant, developer, system, tool, user, "
                 r"got str 'human'", id="role"),
    pytest.param("p.jsonl", '{"prompt": "a", "max_tokens": 3, "output_tokens": 3}\n',
                 r'p.jsonl:1: output_tokens: expected only one of "max_tokens" or "output_tokens"', id="two-lengths"),
    pytest.param("p.jsonl", '{"text": "a"}\n',
                 r"p.jsonl:1: cannot tell the dataset format from the keys \['text'\]; expected \"messages\" or "
                 r"\"prompt\" \(prompts\), .* or name the format: FORMAT:.*p.jsonl", id="unknown-keys"),
    pytest.param("p.jsonl", '{"prompt": "a"}\n["not", "an", "object"]\n',
                 r"p.jsonl:2: expected a JSON object \(a record\), got list", id="jsonl-not-object"),
    pytest.param("p.jsonl", '{"id": "x", "prompt": "a"}\n{"id": "x", "prompt": "b"}\n',
                 r"p.jsonl:2: duplicate id 'x' \(also at .*p.jsonl:1\)", id="duplicate-id"),
    pytest.param("sg.json", json.dumps([{"conversations": [{"from": "human", "value": "q"}]},
                                        {"conversations": [{"from": "human", "value": 5}]}]),
                 r"sg.json: \$\[1\].conversations\[0\].value: expected a string, got int 5", id="sharegpt-value"),
    pytest.param("sg.json", json.dumps([{"conversations": [{"from": "human", "value": "q"}]},
                                        {"conversations": "hello"}]),
                 r"sg.json: \$\[1\].conversations: expected a list of \{\"from\": \"human\"\|\"gpt\", \"value\"\} "
                 r"turns, got str 'hello'", id="sharegpt-conversations"),
    pytest.param("sg.json", '[\n  {"conversations": []},\n  {"conversations": [}\n]\n',
                 r"sg.json:3:22: not valid JSON \(Expecting value\); expected one JSON array of records",
                 id="json-syntax"),
    pytest.param("sg.json", '["just text"]', r"sg.json: \$\[0\]: expected a JSON object \(a record\), got str",
                 id="json-not-object"),
    pytest.param("sg.json", json.dumps([{"conversations": []}]),
                 r"sg.json: no prompts \(skipped: 1 empty conversations\)", id="all-skipped"),
    pytest.param("q.jsonl", '{"question_id": 1, "turns": ["a"]}\n{"question_id": 2, "turns": []}\n',
                 r"q.jsonl:2: turns: expected a non-empty list of strings \(the first turn is the prompt\), "
                 r"got list \[\]",
                 id="spec-bench-turns"),
    pytest.param("q.jsonl", '{"question_id": 1, "turns": ["a"]}\n{"question_id": [2], "turns": ["b"]}\n',
                 r"q.jsonl:2: question_id: expected a string or whole number, got list \[2\]", id="spec-bench-id"),
    pytest.param("ic.jsonl", '{"instruction": "a", "input": "", "output": ""}\n{"input": "x", "output": "y", '
                             '"instruction": ""}\n',
                 r"ic.jsonl:2: instruction: expected a non-empty string, got str ''", id="instructcoder-instruction"),
    pytest.param("ic.json", json.dumps([{"instruction": "a", "output": "b"}]),
                 r"ic.json: \$\[0\].input: expected a string, got nothing", id="instructcoder-input"),
    pytest.param("obj.json", '{\n  "data": [{"prompt": "a"}]\n}\n',
                 r"obj.json:1: not valid JSON .*; expected one JSON object per line \(the file is one JSON object: "
                 r"put the records in a JSON array or one per line\)", id="top-level-object"),
    pytest.param("empty.jsonl", "\n  \n", r"empty.jsonl: empty file; expected JSONL", id="empty"),
    pytest.param("p.csv", "prompt,max_tokens\nhi,5\n",
                 r"p.csv:1: expected JSONL \(a JSON object per line\) or a JSON array of records, "
                 r"got 'prompt,max_tokens",
                 id="csv"),
]


@pytest.mark.parametrize("name, text, message", MALFORMED)
def test_malformed_files_say_where_and_what(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path / name, text)
    with pytest.raises(ConfigError, match=message) as info:
        load_file(path)
    assert str(path) in str(info.value)


def test_forced_format_names_the_missing_field(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "q.jsonl", {"question_id": 1, "turns": ["a"]})
    with pytest.raises(ConfigError, match=r"q.jsonl:1: messages: expected exactly one of .*got nothing "
                                          r"\(reading the file as prompts; force another format"):
        load(f"prompts:{path}", tmp_path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl: not UTF-8 text \(invalid continuation byte at byte 15\)"):
        load_file(path)


# --- identity and sampling ------------------------------------------------------------------------
def test_identity_follows_the_prompts_sent(tmp_path: Path) -> None:
    a = jsonl(tmp_path / "a.jsonl", {"id": "1", "prompt": "hello", "max_tokens": 8})
    b = jsonl(tmp_path / "b.jsonl", {"id": "1", "prompt": "hello!", "max_tokens": 8})
    a2 = write(tmp_path / "a2.jsonl", '{ "max_tokens": 8,   "prompt": "hello", "id": "1" }\n\n')
    ka, kb, ka2 = (load_file(p).identity()["prompts_sha256"] for p in (a, b, a2))
    assert ka != kb  # different content, different key
    assert ka == ka2  # same prompts written differently: still comparable
    assert load_file(a).sha256 != load_file(a2).sha256  # while the file hash records the bytes
    c = jsonl(tmp_path / "c.jsonl", {"id": "1", "prompt": "hello", "max_tokens": 9})
    assert load_file(c).identity()["prompts_sha256"] != ka  # output length is part of the workload


def _session(tmp_path: Path) -> SpecDecSession:
    settings = Settings(gpu="cpu", profile_path=None, runs=None, dry_run=False, endpoint=None,
                        reference_endpoint=None, api_key_env="NO_KEY", json_path=None, reports_dir=tmp_path,
                        max_servers=1, startup_timeout_s=1.0)
    return SpecDecSession(settings, tmp_path, progress=lambda line: None)


def test_sampling_is_seeded_and_never_repeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_specdec.measure import tokens

    monkeypatch.setattr(tokens, "load", lambda model: tokens.Tokenizer(model, why="not loaded here: it imports torch"))
    case = Case(method="ngram", k=3, temperature=0.0, concurrency=1, dataset="builtin", num_prompts=16)
    first = [p.id for p in _session(tmp_path).prompts(case)]
    again = [p.id for p in _session(tmp_path).prompts(case)]
    assert first == again and len(set(first)) == 16
    assert first != [p.id for p in builtin().prompts[:16]]  # a sample over the whole set, not its head
    assert len({p.category for p in _session(tmp_path).prompts(case)}) >= 4
    too_many = Case(method="ngram", k=3, temperature=0.0, concurrency=1, dataset="builtin#translation",
                    num_prompts=17)
    with pytest.raises(ConfigError, match=r"num_prompts=17 but dataset 'builtin#translation' has 16 prompts; "
                                          r"lower num_prompts or use a larger dataset \(prompts are never repeated\)"):
        _session(tmp_path).prompts(too_many)
