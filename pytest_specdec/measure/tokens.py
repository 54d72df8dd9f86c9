"""The target's tokenizer, loaded once per model: what token counts, length caps and synthetic prompts are
measured with, so a "token" in the plugin is the served model's token.

Where it cannot be loaded (a hub name on a machine without the hub, transformers missing), `load` says why
and callers fall back to their documented estimate and record that they did (`Tokenizer.source`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What a count made without the target's tokenizer is: characters / 4 (English prose and code in
#: Llama-3-class tokenizers).
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Tokenizer:
    """A loaded tokenizer (``hf`` set) or the estimate with why there is no tokenizer (``why``)."""

    model: str
    hf: Any = None
    why: str = ""

    @property
    def source(self) -> str:
        """How counts were made, as results and progress lines say it."""
        return "tokenizer" if self.hf is not None else f"characters / {CHARS_PER_TOKEN} ({self.why})"

    def count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens (the estimate rounds up: an empty text is 0)."""
        if self.hf is None:
            return estimate(text)
        return len(self.hf(text, add_special_tokens=False).input_ids)


def estimate(text: str) -> int:
    """The count without a tokenizer: ceil(characters / 4), so an empty text is 0."""
    return -(-len(text) // CHARS_PER_TOKEN)


@functools.lru_cache(maxsize=8)
def load(model: str) -> Tokenizer:
    """The model's tokenizer, or the estimate with the reason it could not be loaded (never raises: a count
    is still possible without it, and the reason is shown where the count is). A hub name is read from the
    local Hugging Face cache only, where vLLM's own download of the target puts it."""
    missing = _not_local(model)
    if missing:  # said before importing transformers, which takes seconds
        return Tokenizer(model, why=missing)
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        return Tokenizer(model, why=f"transformers is not installed: {exc}")
    try:  # local files only: a hub lookup retries for half a minute on a machine without the network
        return Tokenizer(model, hf=AutoTokenizer.from_pretrained(model, local_files_only=True))
    except Exception as exc:  # noqa: BLE001 - any failure to load means: no tokenizer, said with its reason
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Tokenizer(model, why=f"the tokenizer of {model} could not be loaded: {first}")


def _not_local(model: str) -> str:
    """Why ``model`` has no local files to load a tokenizer from ("" when it may have): neither a folder nor
    a hub name in the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if Path(model).expanduser().is_dir():
        return ""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    if (Path(hub) / ("models--" + model.strip("/").replace("/", "--"))).is_dir():
        return ""
    return f"the tokenizer of {model} could not be loaded: no such folder, and not in the Hugging Face cache {hub}"
