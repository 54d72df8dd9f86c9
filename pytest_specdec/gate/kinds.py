"""The closed vocabularies of a verdict, typed once: what it decided, which family it counts in, the unit of its
change and the unit it compared (a run, a pair, a session, a night), and the words a test's check ends in.

Every other module names these through the constants below, never as string literals, so a misspelt verdict is
an attribute error and a type error, not a test that silently never fails. They are plain strings at run time
(`Literal`), so the JSON the plugin writes and reads is unchanged. A word read from a file goes through
`check_decision`/`check_word`: an unknown one is an error naming the file's field, never a silent mismatch.
"""

from __future__ import annotations

from typing import Final, Literal, TypeVar, get_args

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
#: Decided beyond the threshold on one side: the changes a reader looks at first.
MOVED: Final[tuple[Decision, ...]] = (REGRESSED, IMPROVED)

#: Why an A/B test stopped adding pairs (`gate.ab.stop_kind`): its gated verdicts all conclusive (one regressed,
#: one improved, or all unchanged: the equivalence stop), an open one no more pairs could settle, or the maximum.
Stop = Literal["regressed", "improved", "equivalence", "cannot settle", "max reached"]
EQUIVALENCE: Final = "equivalence"
CANNOT_SETTLE: Final = "cannot settle"
MAX_REACHED: Final = "max reached"

#: Whether a verdict can fail the session (gated) or is only shown.
Family = Literal["gated", "shown"]
GATED: Final = "gated"
SHOWN: Final = "shown"
FAMILIES: Final[tuple[Family, ...]] = get_args(Family)

#: The unit of a change: relative (%) or absolute points (acceptance).
Unit = Literal["%", "points"]
PERCENT: Final = "%"
POINTS: Final = "points"
UNITS: Final[tuple[Unit, ...]] = get_args(Unit)


def unit_mark(unit: str) -> str:
    """The mark a figure in ``unit`` is written with: " %" for a relative change, " pt" for points; the gate's
    notes and the output layer's wording both read it."""
    return " %" if unit == PERCENT else " pt"


#: What one sample of a comparison is: a run, a pair of interleaved runs (A/B), a stored session or night.
Per = Literal["run", "pair", "session", "night"]
RUN: Final = "run"
PAIR: Final = "pair"
SESSION: Final = "session"
NIGHT: Final = "night"
#: The method of a speed verdict left unjudged because the stored nights are another machine's (`verdicts.evaluate`).
ANOTHER_MACHINE: Final = "another machine"
PERS: Final[tuple[Per, ...]] = get_args(Per)

#: The rule of a near-deterministic metric (`gate.stats.exact_rule`), as a verdict's `method` names it: no p, and
#: its interval is the range of the differences, not a CI (`Verdict.exact`).
EXACT: Final = "exact"

#: How a test met its stored baseline (`gate.check.Plan.status`).
Status = Literal["compared", "missing", "not-comparable", "error"]
#: How a test's check ended (`gate.check.TestEnd.outcome`): the decisions that end a test, or why none could.
Outcome = Literal["pass", "error", "missing", "not-comparable", "regressed", "inconclusive"]


#: A vocabulary's word type (a Literal of str).
W = TypeVar("W", bound=str)


def check_word(value: object, words: tuple[W, ...], what: str, where: str) -> W:
    """A word read from a file, checked against its vocabulary: an unknown one is a ValueError naming where it
    came from (``where``: the file and field) and the words allowed. The vocabulary's own word is returned, so
    its type is the vocabulary's."""
    for word in words:
        if value == word:
            return word
    raise ValueError(f"{where}: {what} {value!r} is not one of {', '.join(words)}")


def check_decision(value: object, where: str) -> Decision:
    """A decision read from a file, checked: an unknown word is an error naming where it came from."""
    return check_word(value, DECISIONS, "verdict", where)


def split_method(method: str, where: str = "method") -> tuple[str, Per]:
    """A verdict's rule and comparison unit from the combined form that results files recorded before `per` was
    a field of its own ("exact/pair" → ("exact", "pair")); a rule without a unit ("none", "machine state")
    compared runs. An unknown unit is a ValueError naming ``where`` (the file's field) and the method."""
    rule, slash, per = method.rpartition("/")
    if not slash:
        return method, RUN
    return rule, check_word(per, PERS, "comparison unit", f"{where} {method!r}")
