"""The closed vocabularies of a verdict, typed once: what it decided, which family it counts in, the unit of its
change and the unit it compared (a run, a pair, a session, a night).

Every other module names these through the constants below, never as string literals, so a misspelt verdict is
an attribute error and a type error, not a test that silently never fails. They are plain strings at run time
(`Literal`), so the JSON the plugin writes and reads is unchanged.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

#: What one metric's comparison decided.
Decision = Literal["improved", "unchanged", "regressed", "inconclusive", "not-comparable"]
IMPROVED: Final = "improved"
UNCHANGED: Final = "unchanged"
REGRESSED: Final = "regressed"
INCONCLUSIVE: Final = "inconclusive"
NOT_COMPARABLE: Final = "not-comparable"
DECISIONS: Final[tuple[Decision, ...]] = get_args(Decision)
#: Decided either way beyond the threshold: what a session may act on.
CONCLUSIVE: Final[frozenset[Decision]] = frozenset({IMPROVED, UNCHANGED, REGRESSED})

#: Whether a verdict can fail the session (gated) or is only shown.
Family = Literal["gated", "shown"]
GATED: Final = "gated"
SHOWN: Final = "shown"

#: The unit of a change: relative (%) or absolute points (acceptance).
Unit = Literal["%", "points"]
PERCENT: Final = "%"
POINTS: Final = "points"

#: What one sample of a comparison is: a run, a pair of interleaved runs (A/B), a stored session or night.
Per = Literal["run", "pair", "session", "night"]


def check_decision(value: str, where: str) -> Decision:
    """A decision read from a file, checked: an unknown word is an error naming where it came from."""
    if value not in DECISIONS:
        raise ValueError(f"{where}: verdict {value!r} is not one of {', '.join(DECISIONS)}")
    return value  # type: ignore[return-value]
