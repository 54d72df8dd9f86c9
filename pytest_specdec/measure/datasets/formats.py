"""The file formats a dataset may come in, each parsed into rows: one parser per format turns a record
(a JSON object) into a `Prompt` and where its ``max_tokens`` came from, plus detection of the format
from a first record's keys and the output length rules.

Kept apart from the package (`pytest_specdec.measure.datasets`), which reads files, reports where a
record is wrong, and builds the `Dataset`; a new format touches only this module.  It imports nothing
from the package, so the package imports from it and there is no cycle.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from pytest_specdec.measure.tokens import CHARS_PER_TOKEN, estimate

if TYPE_CHECKING:
    from pytest_specdec.measure.types import Prompt

FORMATS = ("prompts", "sharegpt", "spec_bench", "instructcoder")
ALIASES = {"jsonl": "prompts", "mt_bench": "spec_bench"}

#: Output length when a record carries neither a length nor a reference answer (vLLM bench's MT-Bench
#: default, also what ``vllm bench serve --dataset-name spec_bench`` sends).
DEFAULT_OUTPUT_TOKENS = 256
#: Output length from a reference answer: its tokens by the target's tokenizer, or characters / 4 (English
#: prose and code in Llama-3-class tokenizers) where none can be loaded; clamped so every request decodes for
#: a while but none runs away.
MIN_OUTPUT_TOKENS = 16
MAX_OUTPUT_TOKENS = 1024
#: What ``vllm bench serve`` appends to an InstructCoder prompt (vllm/benchmarks/datasets), kept so
#: numbers stay comparable with it.
INSTRUCTCODER_SUFFIX = " Just output the code, do not include any explanation."

_ESTIMATE = (f"estimated from the reference answer: its tokens by the target's tokenizer (without one: "
             f"ceil(characters / {CHARS_PER_TOKEN}); `counted` says which) clamped to "
             f"[{MIN_OUTPUT_TOKENS}, {MAX_OUTPUT_TOKENS}]")
OUTPUT_LENGTH_RULES = {
    "prompts": f"max_tokens (or output_tokens) of each record; missing: {DEFAULT_OUTPUT_TOKENS}",
    "sharegpt": f"{_ESTIMATE} (the first gpt turn after the prompt); no reply: {DEFAULT_OUTPUT_TOKENS}",
    "spec_bench": f"{DEFAULT_OUTPUT_TOKENS} (the format carries no model answer; MT-Bench `reference` "
                  f"entries are judge hints and are not used)",
    "instructcoder": f"{_ESTIMATE} (the `output` code); empty output: {DEFAULT_OUTPUT_TOKENS}",
}
_HUMAN = frozenset({"human", "user"})
_ASSISTANT = frozenset({"gpt", "chatgpt", "assistant", "bing", "bard", "model"})
_ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})


#: Counts a text's tokens: the target's tokenizer (`measure.tokens.Tokenizer.count`); None: characters / 4.
Count: TypeAlias = Callable[[str], int] | None


def estimate_tokens(text: str, count: Count = None) -> int:
    """Output length from a reference answer, by the documented rule: ``count`` (the target's tokenizer)
    where given, else ceil(characters / 4); the dataset records which made its lengths, and its identity
    says so, so lengths counted two ways are never compared as one workload."""
    tokens = (count or estimate)(text)
    return min(MAX_OUTPUT_TOKENS, max(MIN_OUTPUT_TOKENS, tokens))


#: The most output tokens a record may ask for: above any served context length, so a typo such as 1e8
#: is an error. The profile's --max-model-len bounds a record's max_tokens only through
#: `Placement.check_possible`, and only when its caller passes the records.
MAX_GIVEN_TOKENS = 1 << 20


class _Bad(Exception):
    """A record does not fit its format: where inside the record, and what was expected."""

    def __init__(self, where: str, expected: str, got: Any = ...) -> None:
        super().__init__(where)
        self.where, self.expected, self.got = where, expected, got


class _Skip(Exception):
    """A well-formed record with nothing to send (e.g. a ShareGPT conversation without a human turn)."""


class _Said(str):
    """A `got` already in words (e.g. "both"), shown as is."""


def _got(value: Any) -> str:
    if value is ...:
        return "nothing"
    if isinstance(value, _Said):
        return str(value)
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return f"{type(value).__name__} {text[:60]}{'…' if len(text) > 60 else ''}"


def _str(obj: dict[str, Any], key: str, *, empty: bool = False) -> str:
    value = obj.get(key, ...)
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise _Bad(key, "a string" if empty else "a non-empty string", value)
    return value


def _id(obj: dict[str, Any], key: str, default: str) -> str:
    value = obj.get(key, ...)
    if value is ... or value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise _Bad(key, "a string or whole number", value)
    return str(value)


def _from_reference(answer: str, count: Count) -> tuple[str, int]:
    """(where the length came from, max_tokens) for a record whose reference answer may be empty."""
    return ("estimated", estimate_tokens(answer, count)) if answer.strip() else ("default", DEFAULT_OUTPUT_TOKENS)


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


Row: TypeAlias = tuple["Prompt", str]  # the prompt and where its max_tokens came from: given / estimated / default


def _prompts_row(obj: dict[str, Any], default_id: str, count: Count = None) -> Row:
    from pytest_specdec.measure.types import Prompt

    has_messages, has_prompt = "messages" in obj, "prompt" in obj
    if has_messages == has_prompt:
        raise _Bad("messages", 'exactly one of "messages" (chat) or "prompt" (the user turn)',
                   _Said("both") if has_messages else ...)
    if has_prompt:
        messages = _user(_str(obj, "prompt"))
    else:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            raise _Bad("messages", 'a non-empty list of {"role", "content"} objects', messages)
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _Bad(f"messages[{i}]", 'an object {"role", "content"}', m)
            if m.get("role") not in _ROLES:
                raise _Bad(f"messages[{i}].role", f"one of {', '.join(sorted(_ROLES))}", m.get("role", ...))
            if not isinstance(m.get("content", ...), str):
                raise _Bad(f"messages[{i}].content", "a string", m.get("content", ...))
        if not any(m["role"] == "user" and m["content"].strip() for m in messages):
            raise _Bad("messages", "at least one non-empty user message", messages)
    keys = [k for k in ("max_tokens", "output_tokens") if k in obj]
    if len(keys) == 2:
        raise _Bad("output_tokens", 'only one of "max_tokens" or "output_tokens"', obj["output_tokens"])
    source, max_tokens = "default", DEFAULT_OUTPUT_TOKENS
    if keys:
        value = obj[keys[0]]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GIVEN_TOKENS:
            raise _Bad(keys[0], f"a whole number from 1 to {MAX_GIVEN_TOKENS}", value)
        source, max_tokens = "given", value
    category = obj.get("category", "")
    if not isinstance(category, str):
        raise _Bad("category", "a string", category)
    prompt = Prompt(id=_id(obj, "id", default_id), messages=messages, max_tokens=max_tokens, category=category)
    return prompt, source


def _sharegpt_row(obj: dict[str, Any], default_id: str, count: Count = None) -> Row:
    from pytest_specdec.measure.types import Prompt

    turns = obj.get("conversations", ...)
    if not isinstance(turns, list):
        raise _Bad("conversations", 'a list of {"from": "human"|"gpt", "value"} turns', turns)
    for i, t in enumerate(turns):
        if not isinstance(t, dict) or not isinstance(t.get("from"), str):
            raise _Bad(f"conversations[{i}]", 'an object {"from": "human"|"gpt", "value": string}', t)
        if not isinstance(t.get("value", ...), str):
            raise _Bad(f"conversations[{i}].value", "a string", t.get("value", ...))
    if not turns:
        raise _Skip("empty conversations")
    first = next((i for i, t in enumerate(turns) if t["from"] in _HUMAN and t["value"].strip()), None)
    if first is None:
        raise _Skip("without a non-empty human turn")
    reply = next((t["value"] for t in turns[first + 1:] if t["from"] in _ASSISTANT), "")
    source, max_tokens = _from_reference(reply, count)
    category = obj.get("category", "")
    prompt = Prompt(id=_id(obj, "id", default_id), messages=_user(turns[first]["value"]), max_tokens=max_tokens,
                    category=category if isinstance(category, str) else "")
    return prompt, source


def _spec_bench_row(obj: dict[str, Any], default_id: str, count: Count = None) -> Row:
    from pytest_specdec.measure.types import Prompt

    turns = obj.get("turns", ...)
    if not isinstance(turns, list) or not turns:
        raise _Bad("turns", "a non-empty list of strings (the first turn is the prompt)", turns)
    if not isinstance(turns[0], str) or not turns[0].strip():
        raise _Bad("turns[0]", "a non-empty string", turns[0])
    category = obj.get("category", "")
    if not isinstance(category, str):
        raise _Bad("category", "a string", category)
    prompt = Prompt(id=_id(obj, "question_id", default_id), messages=_user(turns[0]),
                    max_tokens=DEFAULT_OUTPUT_TOKENS, category=category)
    return prompt, "default"


def _instructcoder_row(obj: dict[str, Any], default_id: str, count: Count = None) -> Row:
    from pytest_specdec.measure.types import Prompt

    instruction = _str(obj, "instruction")
    code = _str(obj, "input", empty=True)
    output = _str(obj, "output", empty=True)
    text = (f"{code}\n\n" if code.strip() else "") + instruction + INSTRUCTCODER_SUFFIX
    source, max_tokens = _from_reference(output, count)
    prompt = Prompt(id=_id(obj, "id", default_id), messages=_user(text), max_tokens=max_tokens,
                    category="code_editing")
    return prompt, source


_PARSERS: dict[str, Callable[[dict[str, Any], str, Count], Row]] = {
    "prompts": _prompts_row, "sharegpt": _sharegpt_row, "spec_bench": _spec_bench_row,
    "instructcoder": _instructcoder_row,
}
_DETECT_HELP = ('"messages" or "prompt" (prompts), "conversations" (sharegpt), "turns" (spec_bench / MT-Bench) '
                'or "instruction" + "output" (instructcoder)')


def detect_format(obj: Any) -> str | None:
    """The format a first record looks like, by its keys; None when it fits none."""
    if not isinstance(obj, dict):
        return None
    if "conversations" in obj:
        return "sharegpt"
    if "turns" in obj:
        return "spec_bench"
    if "instruction" in obj and "output" in obj:
        return "instructcoder"
    if "messages" in obj or "prompt" in obj:
        return "prompts"
    return None
