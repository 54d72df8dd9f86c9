"""The input tokens of the prompts a test sends, counted as the server will count them, so the results'
input lengths and the --max-model-len check are the served model's tokens, not a guess.

vLLM's chat endpoint renders the messages with the target's chat template (add_generation_prompt) and
tokenizes that text without adding special tokens (the template holds them); the completions endpoint
tokenizes the prompt with special tokens unless the request says add_special_tokens=false. Without the
target's tokenizer (or a chat template) the count is ceil(characters / 4) of the text sent, and the source
says so with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from pytest_specdec.measure.tokens import CHARS_PER_TOKEN, estimate

if TYPE_CHECKING:
    from pytest_specdec.measure.tokens import Tokenizer
    from pytest_specdec.measure.types import Prompt


def source(tok: Tokenizer, prompts: list[Prompt]) -> str:
    """How `count` counts these prompts: "tokenizer", or characters / 4 with why (no tokenizer, or chat
    prompts and a tokenizer without a chat template)."""
    if tok.hf is not None and any(p.messages is not None for p in prompts) and not _template(tok):
        return (f"characters / {CHARS_PER_TOKEN} (the tokenizer of {tok.model} has no chat template to render "
                f"the chat prompts with)")
    return tok.source


def count(tok: Tokenizer, prompts: list[Prompt]) -> tuple[list[int], str]:
    """Each prompt's input tokens and how they were counted (`source`): by the tokenizer, the prompts'
    ``input_tokens`` (`counted`); by the estimate, for the results only (a limit is not judged on a guess)."""
    how = source(tok, prompts)
    return [_tokens(tok, p) if how == "tokenizer" else _estimate(p) for p in prompts], how


def counted(prompt: Prompt, tokens: int, how: str) -> Prompt:
    """The prompt with ``input_tokens`` set where the tokenizer counted it (None: estimated, not counted)."""
    return dataclasses.replace(prompt, input_tokens=tokens if how == "tokenizer" else None)


def _template(tok: Tokenizer) -> bool:
    return bool(getattr(tok.hf, "chat_template", None))


def _tokens(tok: Tokenizer, p: Prompt) -> int:
    """One prompt's tokens as vLLM counts them (see the module's docstring)."""
    if p.messages is not None:
        text = tok.hf.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
        return len(tok.hf(text, add_special_tokens=False).input_ids)
    assert p.prompt is not None
    return len(tok.hf(p.prompt, add_special_tokens=p.add_special_tokens is not False).input_ids)


def _estimate(p: Prompt) -> int:
    """ceil(characters / 4) of the text sent (chat: the messages' contents; the template's tokens unknown)."""
    text = p.prompt if p.prompt is not None else "".join(str(m.get("content") or "") for m in p.messages or ())
    return estimate(text)
