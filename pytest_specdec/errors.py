"""One base class for every error the plugin raises, so callers can catch them together."""

from __future__ import annotations


class SpecDecError(Exception):
    """Base of all pytest-specdec errors; the message always names what to fix."""


class ConfigError(SpecDecError):
    """Bad user input: an option, marker, profile or dataset that cannot be used as given."""


class ServerStartError(SpecDecError):
    """A vLLM server did not become ready; the message carries the command, port and log tail."""
