"""One base class for every error the plugin raises, so callers can catch them together; the one parse
of a JSON object whose failure each caller words for its own file or server; and the one check of a stored
record's fields, worded to follow the record's path in its file."""

from __future__ import annotations

import importlib
import json
from collections.abc import Collection, Mapping
from types import ModuleType
from typing import Any


class SpecDecError(Exception):
    """Base of all pytest-specdec errors; the message always names what to fix."""


class ConfigError(SpecDecError):
    """Bad user input: an option, marker, profile or dataset that cannot be used as given."""


class SpecDecDeprecationWarning(FutureWarning):
    """A spelling (an option, a profile key) that still works for one release and then goes: shown by default,
    in pytest and outside it (a FutureWarning, as Python's own warnings meant for users are)."""


class ServerStartError(SpecDecError):
    """A vLLM server did not become ready; the message carries the command, port and log tail."""


#: The optional dependencies, by import name: (distribution, the pytest-specdec extra that installs it).
EXTRAS = {"pytest_benchmark": ("pytest-benchmark", "benchmark"), "ruptures": ("ruptures", "history"),
          "openai": ("openai", "openai")}


def import_extra(module: str, feature: str) -> ModuleType:
    """`module`, an optional dependency imported where a feature needs it (the plugin starts without it); when
    it is missing, a ConfigError naming the feature and the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        dist, extra = EXTRAS[module.split(".")[0]]
        raise ConfigError(f"{feature} needs {dist}, which is not installed ({exc}): pip install "
                          f"'pytest-specdec[{extra}]'") from None


def json_object(text: str) -> dict[str, Any]:
    """`text` parsed as a JSON object: ValueError when it is not JSON, TypeError when it is other JSON."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError(f"{type(data).__name__}, not a JSON object")
    return data


def field_problem(record: Any, fields: Mapping[str, tuple[type, ...]], required: Collection[str] | None = None
                  ) -> str:
    """What is wrong with one stored record ("" when nothing), worded to follow its path in the file
    (`" has no `valid`"`, `".drafts is 'x', not int or float or NoneType"`). ``fields`` are the types each
    may hold (a bool is no int here); ``required`` the ones it must have (default: all of them)."""
    if not isinstance(record, Mapping):
        return " is not an object"
    for key, kinds in fields.items():
        if key not in record:
            if required is None or key in required:
                return f" has no `{key}`"
            continue
        value = record[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return f".{key} is {value!r}, not {' or '.join(k.__name__ for k in kinds)}"
    return ""
