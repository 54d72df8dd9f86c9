"""Fields of the JSON results as the report, its charts and the pytest-benchmark export read them."""

from __future__ import annotations

import math
from typing import Any


def number(x: Any) -> float | None:
    """A finite number from the results as a float; None for null, a bool, a string, NaN or infinity."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def test_name(nodeid: str) -> tuple[str, str]:
    """`path::test_fn[id]` → (`path::test_fn`, `id`)."""
    base, sep, rest = nodeid.partition("[")
    return base, rest[:-1] if sep and rest.endswith("]") else rest
