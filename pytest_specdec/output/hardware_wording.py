"""What a session says about the machine it ran on, for the terminal and the top of the report alike: a machine
without baselines of its own (which machines have them, the ways on), the machine's state against its stored
nights, and the report's view of both. The machine factor's sentence is `wording.machine_sentence`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_specdec.output.schema import MachineStateEntry


def no_own_baselines_lines(hardware: Mapping[str, Any], unjudged: int, *, failed: bool, recorded: int | None,
                           acceptance: Sequence[Sequence[str]] = ()) -> list[str]:
    """The one block a session on a machine without baselines of its own says, for the terminal and the top of
    the report alike: this machine, the machines that have baselines, what became of the tests, the ways on.
    ``hardware`` is `output.schema.hardware_entry`; ``recorded``: how many files --update-baselines created in this
    machine's folder (None without the flag); ``acceptance``: per test whose acceptance was judged against other
    machines' nights, their folder keys (`gate.store.BaselineStore.portable`)."""
    this, root, profile = hardware["this"], hardware.get("root") or "baselines", hardware["profile"]
    folder = f"{root}/{profile}/{this['key']}/"
    others = [f"{m['name']} ({root}/{profile}/{m['key']}/, {m['files']} file(s)"
              + (f"; differs from this one: {', '.join(m['differs'])})" if m.get("differs") else ")")
              for m in hardware["others"]]
    by_machine: dict[str, int] = {}
    for keys in acceptance:
        for k in keys:
            by_machine[k] = by_machine.get(k, 0) + 1
    portable = ([f"  acceptance (rate, length, per position, coverage) of {sum(1 for a in acceptance if a)} test(s) "
                 "judged against other machines' nights: "
                 + "; ".join(f"{root}/{profile}/{k}/ ({n} test(s))" for k, n in by_machine.items())
                 + "; the tokens decide it, not the machine, so their nights hold here (docs/gate.md, "
                 "\"Acceptance on any machine\")"] if by_machine else [])
    if recorded is not None:
        lines = [f"specdec: this machine, {this['name']}, had no baselines of profile {profile}: this session "
                 f"recorded its nights in {folder}, {recorded} file(s) of {unjudged} test(s) whose speed was not "
                 "judged (the baseline summary says why any was not written); the next session compares against them",
                 *portable]
        if others and not by_machine:
            lines.append("  other machines' baselines, read by none of this machine's tests and left untouched: "
                         + "; ".join(others))
        return lines
    what = ("they FAIL (--specdec-strict)" if failed else
            "they pass, their speed unjudged (--specdec-strict fails them)")
    return [
        f"specdec: no baselines for this machine, {this['name']} ({folder} holds none): "
        f"{unjudged} test(s) measured, the speed of none judged; {what}",
        *portable,
        f"  baselines of profile {profile} were measured on: " + "; ".join(others),
        "  a speedup measured on other hardware says nothing about this one, so no speed figure is compared with them",
        "  the ways on:",
        "    record this machine's nights (writes only its own folder, and only missing files), then run again "
        "to compare: the same command with --update-baselines=missing",
        "    or judge a change within one session on this machine, candidate against base: "
        "--specdec-base-draft METHOD=MODEL (docs/gate.md, \"A/B in one session\")",
    ]


def machine_state_lines(state: MachineStateEntry | None) -> list[str]:
    """The one block on the machine's state, for the terminal (`gate.machine.StateSummary`, read as the results hold
    it) and the top of the report alike: tonight's state and the stored nights', and, where a test's speedup or E2E
    ratio could not be judged for it, which and the ways on. One line when every ratio metric was judged."""
    from pytest_specdec.gate.machine import describe_state

    if state is None:
        return []
    tonight = describe_state(state.tonight)
    stored = (f"the stored nights {state.stored}" if state.stored_nights else "no stored night")
    head = (f"specdec: machine state: tonight {tonight}; {stored} (a night counts as this state within "
            f"{tolerance_phrase(state)})")
    bad = state.not_comparable
    if not bad:
        return [head]
    return [
        head,
        f"  {len(bad)} of {state.n_compared} compared test(s) have no stored night in this state: their "
        "speedup, E2E ratio and absolute figures are not-comparable (machine state), not judged; acceptance is "
        "judged as usual",
        *(f"    {nodeid}: {', '.join(metrics)}" for nodeid, metrics in bad),
        "  on this machine the speedup moves with the machine's state (docs/gate.md, \"Machine state\"); the ways on:",
        "    judge the change within one session, where both arms see one state: --specdec-base-draft METHOD=MODEL "
        "or --specdec-base-python PATH",
        "    or record nights in this state beside the others: the same command with --update-baselines",
    ]


def tolerance_phrase(state: MachineStateEntry) -> str:
    """The state tolerance as a results file gives it: one figure (±15 %, the profile's), or one per kind with
    where they come from (a file before per-kind tolerances has ``tolerance_pct`` alone)."""
    from pytest_specdec.gate.machine import StateTolerance

    tol = StateTolerance.from_setting(state.tolerance or state.tolerance_pct, "machine_state")
    return tol.phrase() + (f", {tol.source}" if tol.source else "")


def hardware_view(hw: Any, tests: Sequence[Any], update: Mapping[str, Any] | None) -> dict[str, Any]:
    """The report's words on the machine: the baselines folder the session read, and when that machine had
    none of its own the session's one block (``hw``: the results' `gate.settings.hardware`, None in a file
    recorded before baselines were kept per machine; ``tests``: the results' `TestEntry`s; ``update``: what
    --update-baselines wrote, with its ``created`` files, None without the flag)."""
    recorded = None if update is None else len(update["created"])
    if not isinstance(hw, Mapping):
        return {"folder": None, "block": []}
    this = hw["this"]
    unjudged = [t for t in tests if t.baseline is not None and (t.baseline.status == "missing" or t.baseline.machines)]
    show = unjudged and not this["files"] and (hw["others"] or recorded is not None)
    block = no_own_baselines_lines(hw, len(unjudged), failed=any(t.outcome == "failed" for t in unjudged),
                                   recorded=recorded,
                                   acceptance=[t.baseline.machines for t in unjudged if t.baseline is not None]
                                   ) if show else []
    return {"folder": f"{hw.get('root') or 'baselines'}/{hw['profile']}/{this['key']}", "block": block}
