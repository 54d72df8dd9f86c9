"""Prompt sets: the built-in one written for this project, and loaders for the files users bring.

A dataset is named by a spec string ``[FORMAT:]PATH[#CATEGORY,...]`` (the marker's ``dataset=`` or
``--specdec-dataset``): ``builtin`` or a file path, an optional format prefix that overrides the
detection by content, and an optional category filter.  Formats:

- ``prompts`` (alias ``jsonl``): one object per line (or a JSON array) with chat ``messages`` or a
  ``prompt`` string, optional ``id``, ``category`` and ``max_tokens`` (or ``output_tokens``, as in
  ``vllm bench serve``'s custom JSONL).  The built-in set is such a file.
- ``sharegpt``: a JSON array of ``{"id", "conversations": [{"from": "human"|"gpt", "value"}]}``.
- ``spec_bench`` (alias ``mt_bench``): JSONL of ``{"question_id", "category", "turns": [...]}``.
- ``instructcoder``: JSON or JSONL of ``{"instruction", "input", "output"}``.

The plugin measures through the chat API, so every prompt becomes chat ``messages`` (a ``prompt``
string or a first turn is the single user message, as ``vllm bench serve`` sends it).
Output length (``max_tokens``) rules are in ``OUTPUT_LENGTH_RULES`` and recorded with each dataset.
Each format's record parser, its detection and those rules are in `formats.py`; this module reads the
file, reports where a record is wrong and builds the `Dataset` (names from there are re-exported here).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.datasets.formats import (
    _DETECT_HELP,
    _PARSERS,
    ALIASES,
    DEFAULT_OUTPUT_TOKENS,
    FORMATS,
    INSTRUCTCODER_SUFFIX,
    MAX_GIVEN_TOKENS,
    MAX_OUTPUT_TOKENS,
    MIN_OUTPUT_TOKENS,
    OUTPUT_LENGTH_RULES,
    Row,
    _Bad,
    _got,
    _Skip,
    detect_format,
    estimate_tokens,
)
from pytest_specdec.measure.tokens import CHARS_PER_TOKEN, Tokenizer

if TYPE_CHECKING:
    from pytest_specdec.measure.types import Prompt

__all__ = [
    "ALIASES", "BUILTIN", "CHARS_PER_TOKEN", "DEFAULT_OUTPUT_TOKENS", "FORMATS", "INSTRUCTCODER_SUFFIX",
    "MAX_GIVEN_TOKENS", "MAX_OUTPUT_TOKENS", "MIN_OUTPUT_TOKENS", "OUTPUT_LENGTH_RULES", "Dataset", "DatasetSpec",
    "InputCounts", "Row", "builtin", "detect_format", "estimate_tokens", "load", "load_file", "load_jsonl",
]

BUILTIN = Path(__file__).with_name("builtin.jsonl")


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed ``[FORMAT:]PATH[#CATEGORY,...]``."""

    path: str
    format: str | None = None
    categories: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> DatasetSpec:
        """Split the spec; a prefix before ``:`` is a format only when it names one (``C:\\x`` is a path)."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"dataset: expected 'builtin' or [FORMAT:]PATH[#CATEGORY,...], got {text!r}")
        rest, fmt = text.strip(), None
        prefix, sep, after = rest.partition(":")
        if sep and (prefix in FORMATS or prefix in ALIASES):
            fmt, rest = ALIASES.get(prefix, prefix), after
        categories: tuple[str, ...] = ()
        if "#" in rest:
            rest, _, cats = rest.rpartition("#")
            categories = tuple(c.strip() for c in cats.split(","))
            if not all(categories):
                raise ConfigError(f"dataset {text!r}: expected #CATEGORY[,CATEGORY...] after the path, got #{cats!r}")
        if not rest:
            raise ConfigError(f"dataset {text!r}: no path; expected 'builtin' or [FORMAT:]PATH[#CATEGORY,...]")
        if rest == "builtin" and fmt not in (None, "prompts"):
            raise ConfigError(f"dataset {text!r}: the built-in set is in the prompts format, not {fmt}")
        return cls(rest, fmt, categories)

    def with_path(self, path: str) -> DatasetSpec:
        return DatasetSpec(path, self.format, self.categories)

    def __str__(self) -> str:
        return (f"{self.format}:" if self.format else "") + self.path + (
            "#" + ",".join(self.categories) if self.categories else "")


@dataclass
class InputCounts:
    """The input tokens of the prompts the session sent, as the server counts them (`measure.counting`), for
    the dataset's results block: counted as tests send them, never the whole file up front (a 50k-record
    ShareGPT would cost minutes)."""

    sources: list[str] = field(default_factory=list)  # "tokenizer", or the estimate with why there was none
    tokens: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # id -> (category, input, max_tokens)

    @property
    def source(self) -> str:
        """How the counts were made; two ways (chat and a template-less completions count) are both said."""
        return "; ".join(self.sources)

    def add(self, source: str, prompts: list[Prompt], tokens: list[int]) -> None:
        """Record the prompts' input tokens (``tokens``, in order) and how they were counted; a prompt sent
        again (by another test, with its own max_tokens) keeps the most max_tokens it was sent with."""
        if source not in self.sources:
            self.sources.append(source)
        for p, n in zip(prompts, tokens, strict=True):
            before = self.tokens.get(p.id, ("", 0, 0))[2]
            self.tokens[p.id] = (p.category, n, max(before, p.max_tokens))

    def by_category(self) -> dict[str, dict[str, int | float]]:
        """Per category: prompts counted, their input tokens' mean, min and max, and the most max_tokens."""
        groups: dict[str, list[tuple[int, int]]] = {}
        for category, n, out in self.tokens.values():
            groups.setdefault(category, []).append((n, out))
        return {c: {"prompts": len(g), "input_tokens_mean": round(sum(n for n, _ in g) / len(g), 1),
                    "input_tokens_min": min(n for n, _ in g), "input_tokens_max": max(n for n, _ in g),
                    "max_tokens_max": max(o for _, o in g)} for c, g in sorted(groups.items())}


@dataclass(frozen=True)
class Dataset:
    """Prompts plus the identity that goes into comparability keys and what loading did to the file."""

    name: str
    prompts: tuple[Prompt, ...]
    sha256: str  # of the file's bytes (check it with sha256sum)
    format: str = "prompts"
    path: str = ""
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> records left out (never silent)
    lengths: dict[str, int] = field(default_factory=dict)  # given / estimated / default -> prompts
    #: how estimated output lengths were counted: "tokenizer", or characters / 4 with why ("" when none was)
    counting: str = ""
    inputs: InputCounts = field(default_factory=InputCounts, compare=False)

    def by_category(self, *categories: str) -> list[Prompt]:
        return [p for p in self.prompts if p.category in categories]

    @property
    def prompts_sha256(self) -> str:
        """Hash of what is sent (ids, categories, messages, max_tokens): changes exactly when the workload
        does, also when the file is the same but the category filter or a loader rule differs."""
        rows = [[p.id, p.category, p.messages, p.prompt, p.max_tokens] for p in self.prompts]
        blob = json.dumps(rows, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def counted_by(self) -> str | None:
        """Which counting made the estimated output lengths, without the machine's reason (None: none was
        estimated): in the identity, so lengths counted by chars / 4 are never judged against the tokenizer's."""
        if not self.lengths.get("estimated"):
            return None
        return "tokenizer" if self.counting == "tokenizer" else f"characters / {CHARS_PER_TOKEN}"

    def identity(self) -> dict[str, Any]:
        """The comparability key: a baseline measured on other prompts is not comparable."""
        key = {"name": self.name, "format": self.format, "prompts_sha256": self.prompts_sha256}
        return key if self.counted_by is None else {**key, "output_lengths_counted": self.counted_by}

    def describe(self) -> dict[str, Any]:
        """What the JSON results record about the dataset."""
        return {
            **self.identity(), "path": self.path, "file_sha256": self.sha256, "prompts": len(self.prompts),
            "categories": dict(sorted(Counter(p.category for p in self.prompts).items())),
            "skipped": dict(self.skipped),
            "output_lengths": {"rule": OUTPUT_LENGTH_RULES[self.format], **self.lengths,
                               **({"counted": self.counting} if self.counted_by else {})},
            **({"input_tokens": {"counted": self.inputs.source, "by_category": self.inputs.by_category()}}
               if self.inputs.tokens else {}),
        }

    def summary(self) -> str:
        """One progress line: how many prompts, and anything left out or defaulted."""
        parts = [f"{self.name}: {len(self.prompts)} prompts ({self.format}, sha256 {self.sha256[:12]})"]
        if self.skipped:
            parts.append("skipped " + ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())))
        if self.lengths.get("default"):
            parts.append(f"{self.lengths['default']} without a length got max_tokens={DEFAULT_OUTPUT_TOKENS}")
        if self.lengths.get("estimated"):
            parts.append(f"{self.lengths['estimated']} lengths estimated from reference answers, counted by "
                         f"{self.counting}")
        return "; ".join(parts)

    def select(self, categories: tuple[str, ...]) -> Dataset:
        """Only the prompts of ``categories``; an unknown category is an error naming the ones there are."""
        import dataclasses

        have = sorted({p.category for p in self.prompts})
        unknown = [c for c in categories if c not in have]
        if unknown:
            raise ConfigError(f"dataset {self.name}: no prompts of category {', '.join(map(repr, unknown))}; "
                              f"categories in {self.path}: {', '.join(have) or '(none)'}")
        name = f"{self.name}#{','.join(categories)}"
        return dataclasses.replace(self, name=name, prompts=tuple(self.by_category(*categories)))




def _records(path: Path, text: str) -> tuple[bool, Iterator[tuple[str, str, Any]]]:
    """(is a JSON document, iterator of (location, default id suffix, record)).

    Locations are ``file:LINE`` for JSONL and ``file: $[i]`` (a JSON path) for a JSON array.
    """
    stripped = text.lstrip()
    if not stripped:
        raise ConfigError(f"{path}: empty file; expected JSONL (one JSON object per line) or a JSON array of records")
    if stripped[0] == "[":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg}); expected one JSON "
                              "array of records") from None
        return True, ((f"{path}: $[{i}]", str(i), obj) for i, obj in enumerate(doc))
    if stripped[0] != "{":
        raise ConfigError(f"{path}:1: expected JSONL (a JSON object per line) or a JSON array of records, got "
                          f"{stripped[:30]!r}")

    def lines() -> Iterator[tuple[str, str, Any]]:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                hint = ""
                if lineno == 1:
                    try:
                        whole = json.loads(text)
                    except json.JSONDecodeError:
                        whole = None
                    if isinstance(whole, dict):
                        hint = " (the file is one JSON object: put the records in a JSON array or one per line)"
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno}); expected "
                                  f"one JSON object per line{hint}") from None
            yield f"{path}:{lineno}", str(lineno), obj

    return False, lines()


def load_file(path: Path, fmt: str | None = None, name: str | None = None,
              tokenizer: Callable[[], Tokenizer] | None = None) -> Dataset:
    """Read a prompt file in any supported format (detected from its first record unless ``fmt``); output
    lengths estimated from reference answers are counted by ``tokenizer()`` (the target's, loaded at the
    first reference answer: a file without one never loads it), else chars / 4.

    A malformed record is an error naming the file, the line (JSONL) or JSON path (JSON array), the
    field and what was expected.  Records with nothing to send are counted in ``skipped``, never dropped
    silently.
    """
    if fmt is not None and fmt not in _PARSERS:
        raise ConfigError(f"dataset format {fmt!r}: expected one of {', '.join(FORMATS)}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"dataset {path}: cannot read it ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); expected JSON or "
                          "JSONL") from None
    is_doc, records = _records(path, text)
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    skipped: Counter[str] = Counter()
    lengths: Counter[str] = Counter()
    parser = _PARSERS[fmt] if fmt else None
    loaded: list[Tokenizer] = []

    def count(text: str) -> int:
        if not loaded:
            loaded.append(tokenizer() if tokenizer is not None else Tokenizer("", why="no tokenizer was given"))
        return loaded[0].count(text)  # without one: ceil(characters / 4), the documented estimate
    for loc, suffix, obj in records:
        if not isinstance(obj, dict):
            raise ConfigError(f"{loc}: expected a JSON object (a record), got {_got(obj)}")
        if parser is None:
            fmt = detect_format(obj)
            if fmt is None:
                raise ConfigError(f"{loc}: cannot tell the dataset format from the keys {sorted(obj)}; expected "
                                  f"{_DETECT_HELP}, or name the format: FORMAT:{path} with FORMAT one of "
                                  f"{', '.join(FORMATS)}")
            parser = _PARSERS[fmt]
        try:
            prompt, source = parser(obj, f"{path.stem}-{suffix}", count)
        except _Skip as skip:
            skipped[str(skip)] += 1
            continue
        except _Bad as bad:
            sep = "." if is_doc else ": "
            raise ConfigError(f"{loc}{sep}{bad.where}: expected {bad.expected}, got {_got(bad.got)} "
                              f"(reading the file as {fmt}; force another format with FORMAT:{path})") from None
        if prompt.id in seen:
            raise ConfigError(f"{loc}: duplicate id {prompt.id!r} (also at {seen[prompt.id]}); ids must be unique "
                              "because outputs are matched by id")
        seen[prompt.id] = loc
        prompts.append(prompt)
        lengths[source] += 1
    if not prompts:
        why = f" (skipped: {', '.join(f'{n} {r}' for r, n in skipped.items())})" if skipped else ""
        raise ConfigError(f"{path}: no prompts{why}")
    assert fmt is not None
    counting = loaded[0].source if loaded and lengths.get("estimated") else ""
    return Dataset(name=name or path.name, prompts=tuple(prompts), sha256=hashlib.sha256(raw).hexdigest(),
                   format=fmt, path=str(path), skipped=dict(skipped), lengths=dict(lengths), counting=counting)


def load_jsonl(path: Path, name: str | None = None) -> Dataset:
    """A prompts-format file (``messages`` or ``prompt`` per line)."""
    return load_file(path, "prompts", name=name or path.stem)


def builtin() -> Dataset:
    return load_file(BUILTIN, "prompts", name="builtin")


def load(spec: str, root: Path, tokenizer: Callable[[], Tokenizer] | None = None) -> Dataset:
    """The dataset a spec string names; a relative path is relative to ``root`` (the rootdir); ``tokenizer``
    (the target's) counts lengths estimated from reference answers."""
    parsed = DatasetSpec.parse(spec)
    if parsed.path == "builtin":
        dataset = builtin()
    else:
        path = Path(parsed.path).expanduser()
        if not path.is_absolute():
            path = root / path
        if not path.is_file():
            raise ConfigError(f"dataset {spec!r}: no such file ({path}); use 'builtin' or a file path")
        dataset = load_file(path, parsed.format, tokenizer=tokenizer)
    return dataset.select(parsed.categories) if parsed.categories else dataset
