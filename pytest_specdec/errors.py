"""One base class for every error the plugin raises, so callers can catch them together; and the one
parse of a JSON object whose failure each caller words for its own file or server."""

from __future__ import annotations

import json
from typing import Any


class SpecDecError(Exception):
    """Base of all pytest-specdec errors; the message always names what to fix."""


class ConfigError(SpecDecError):
    """Bad user input: an option, marker, profile or dataset that cannot be used as given."""


class ServerStartError(SpecDecError):
    """A vLLM server did not become ready; the message carries the command, port and log tail."""


def json_object(text: str) -> dict[str, Any]:
    """`text` parsed as a JSON object: ValueError when it is not JSON, TypeError when it is other JSON."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError(f"{type(data).__name__}, not a JSON object")
    return data
