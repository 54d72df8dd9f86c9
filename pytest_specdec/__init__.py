"""pytest-specdec: guard speculative decoding in vLLM against performance regressions."""

from __future__ import annotations

__version__ = "0.1.0"
