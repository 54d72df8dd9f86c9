"""Which revision of a hub model vLLM loaded: the commit its local Hugging Face cache resolves the model to.

Why: a profile that does not pin a draft head's revision gets whatever the hub's default branch holds on the
night the cache was filled; when the head's owner pushes new weights, the next download changes tonight's
acceptance with no change in any file of the project. The loaded commit is recorded as under test, so the
change shows in the baseline diff. It is read from the cache vLLM downloads into (huggingface_hub's layout:
``models--ORG--NAME/refs/<branch>`` names ``snapshots/<commit>``), after the servers have started.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

#: A full commit hash: a revision pinned to one is what vLLM loads, whatever the cache's refs say.
_COMMIT = re.compile(r"[0-9a-f]{40}")


def is_hub_id(model: str) -> bool:
    """A hub repository id (``ORG/NAME`` or ``NAME``), not a local path."""
    return not Path(model).exists() and not model.startswith(("/", ".", "~"))


def cache_dir(env: Mapping[str, str]) -> str | None:
    """The hub cache of a server with environment ``env`` (its own settings over this process's, as the server gets
    them), read now: huggingface_hub reads HF_HUB_CACHE / HF_HOME once, when first imported, and a process's
    environment can change after that. None: neither is set, and huggingface_hub's default is the server's too."""
    merged = {**os.environ, **env}
    if merged.get("HF_HUB_CACHE"):
        return merged["HF_HUB_CACHE"]
    if merged.get("HF_HOME"):
        return str(Path(merged["HF_HOME"]) / "hub")
    return None


def loaded_revision(model: str, revision: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The commit the hub cache resolves ``model`` at ``revision`` (None: the default branch) to, as vLLM loads
    it; None for a local path, a model not in the cache, or without huggingface_hub."""
    if not is_hub_id(model):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(model, "config.json", cache_dir=cache_dir(env or {}), revision=revision)
    except ValueError:  # not a valid repository id (huggingface_hub's HFValidationError)
        return None
    if not isinstance(found, str):
        return revision if revision and _COMMIT.fullmatch(revision) else None
    return Path(found).parent.name  # .../snapshots/<commit>/config.json
