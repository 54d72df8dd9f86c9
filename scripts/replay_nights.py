"""Replay stored nights as tonight: what the gate would have said about a night nothing changed in.

    .venv/bin/python -m scripts.replay_nights baselines/cpu [--profile cpu] [--threshold speedup=25]

For every night index i present in every file, night i of each file plays "tonight" and the file's other
nights are the baseline; the pooled night variances and machine factors come from those other nights
only, as in a real session, with the profile's night sd floor. Prints, per replayed night, how many gated
verdicts of each kind the suite would get (after Benjamini-Hochberg over the gated family) and the median
smallest speedup drop each test catches. No looks are replayed: tonight has the runs the night stored.
"""

from __future__ import annotations

import argparse
import statistics
import tomllib
from collections import Counter
from pathlib import Path

from pytest_specdec.gate.baselines import hardware_key, load
from pytest_specdec.gate.check import Judgement, Plan
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.pipeline import Pipeline, Stored, judge_all
from pytest_specdec.gate.registry import GATED
from pytest_specdec.gate.thresholds import build_thresholds, parse_threshold_items
from pytest_specdec.output.wording import machine_sentence

PROFILES = Path(__file__).resolve().parents[1] / "pytest_specdec" / "profiles"


def replay(files: dict[str, dict], index: int, thresholds: dict[str, float], floor: float = 0.0,
           alpha: float = 0.05) -> tuple[Counter, list[float], str]:
    """(verdict counts per gated metric, speedup MDEs, machine-factor line) with night ``index`` as tonight,
    judged by the gate's pipeline as a session would judge it."""
    base: dict[str, dict] = {}
    family = []
    built = build_thresholds(thresholds)
    for path, data in files.items():
        nights = data["sessions"]
        rest = [e for j, e in enumerate(nights) if j != index % len(nights)]
        base[path] = dict(data, sessions=rest)
        plan = Plan(path=Path(path), status="compared", checked=True, comparability={}, under_test={},
                    baseline=base[path], alpha=alpha, gate=GATED, thresholds=built)
        family.append((path, Judgement(plan, night=Night.from_entry(nights[index]))))
    machine, family = judge_all(Pipeline(Stored(tuple(base.values()), floor), alpha, "bh"), family, built)
    counts: Counter = Counter()
    mdes = []
    for _, c in family:
        for v in c.final or []:
            if v.family != "gated":
                continue
            counts[(v.metric, v.verdict)] += 1
            if v.metric == "speedup" and v.mde is not None:
                mdes.append(v.mde)
    return counts, mdes, ("specdec: " + machine_sentence(machine)) if machine else "no machine factor"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baselines", type=Path, help="one machine's baselines, e.g. "
                    "baselines/cpu/amd-epyc-2cpu-36c383, or a profile's folder holding one machine's")
    ap.add_argument("--profile", default="cpu", help="the profile whose [verdicts] thresholds apply")
    ap.add_argument("--threshold", action="append", default=[], metavar="METRIC=VALUE")
    args = ap.parse_args(argv)
    paths = sorted(args.baselines.rglob("*.json"))
    if not paths:
        ap.error(f"no baseline files under {args.baselines}")
    files = {str(p): d for p in paths if (d := load(p, "--update-baselines")) is not None}
    machines = sorted({hardware_key(d["comparability"]) for d in files.values()})
    if len(machines) > 1:  # a night is one machine's: never replayed against another's
        ap.error(f"{args.baselines} holds the nights of {len(machines)} machines ({', '.join(machines)}); name one")
    files = {p: d for p, d in files.items() if len(d["sessions"]) >= 3}
    if not files:  # a night is replayed against the others: two leave one night of variance, none of its spread
        ap.error(f"no baseline file under {args.baselines} holds 3 nights or more; record more nights with "
                 "`pytest suites/ --update-baselines`")
    nights = min(len(d["sessions"]) for d in files.values())
    profile = tomllib.loads((PROFILES / f"{args.profile}.toml").read_text())
    thresholds = dict(profile.get("verdicts", {}).get("thresholds", {}))
    floor = float(profile.get("verdicts", {}).get("min_night_sd", 0.0))
    thresholds.update(parse_threshold_items(args.threshold, "--threshold"))
    print(f"{len(files)} files with >= 3 nights; thresholds {thresholds}; night sd floor {floor:g} %")
    print("| tonight = night | speedup unchanged / inconclusive / regressed | P95 E2E ratio conclusive "
          "| acceptance conclusive | median speedup drop caught |")
    print("|---|---|---|---|---|")
    for i in range(nights):
        c, mdes, line = replay(files, i, thresholds, floor)
        n = len(files)
        conc = lambda metric, n=n, c=c: n - c[(metric, "inconclusive")] - c[(metric, "not-comparable")]  # noqa: E731
        print(f"| {i + 1} of {nights} | {c[('speedup', 'unchanged')]} / {c[('speedup', 'inconclusive')]} / "
              f"{c[('speedup', 'regressed')]} of {n} | {conc('e2e_p95_ratio')} of {n} | "
              f"{conc('acceptance_rate')} of {n} | {statistics.median(mdes) if mdes else float('nan'):.1f} % |")
        print(f"<!-- {line} -->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
