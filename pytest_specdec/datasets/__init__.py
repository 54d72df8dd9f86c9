"""Prompt sets: the built-in one written for this project, and (later) loaders for user files.

Each line of a JSONL prompt file is {"id", "category", "messages" | "prompt", "max_tokens"}.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..load import Prompt

BUILTIN = Path(__file__).with_name("builtin.jsonl")


@dataclass(frozen=True)
class Dataset:
    """Prompts plus the identity that goes into comparability keys."""

    name: str
    prompts: tuple[Prompt, ...]
    sha256: str

    def by_category(self, *categories: str) -> list[Prompt]:
        return [p for p in self.prompts if p.category in categories]


def load_jsonl(path: Path, name: str | None = None) -> Dataset:
    """Read a prompt JSONL file; a malformed line is an error naming the line and what was expected."""
    from ..load import Prompt

    raw = path.read_bytes()
    prompts: list[Prompt] = []
    for lineno, line in enumerate(raw.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            messages = obj.get("messages")
            prompt = obj.get("prompt")
            if (messages is None) == (prompt is None):
                raise ValueError('exactly one of "messages" (chat) or "prompt" (completions)')
            max_tokens = int(obj["max_tokens"])
            if max_tokens < 1:
                raise ValueError('"max_tokens" >= 1')
            prompts.append(
                Prompt(
                    id=str(obj.get("id", f"{path.stem}-{lineno}")),
                    messages=messages,
                    prompt=prompt,
                    max_tokens=max_tokens,
                    category=str(obj.get("category", "")),
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{path}:{lineno}: expected a JSON object with {exc}") from exc
    if not prompts:
        raise ConfigError(f"{path}: no prompts")
    return Dataset(name=name or path.stem, prompts=tuple(prompts), sha256=hashlib.sha256(raw).hexdigest())


def builtin() -> Dataset:
    return load_jsonl(BUILTIN, name="builtin")
