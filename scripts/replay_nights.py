"""Replay stored nights as tonight: what the gate would have said about a night nothing changed in.

    .venv/bin/python scripts/replay_nights.py baselines/cpu [--profile cpu] [--threshold speedup=25]

For every night index i present in every file, night i of each file plays "tonight" and the file's other
nights are the baseline; the pooled night variances and machine factors come from those other nights
only, as in a real session, with the profile's night sd floor. Prints, per replayed night, how many gated verdicts of each kind the
suite would get (after Benjamini-Hochberg over the gated family) and the median smallest speedup drop
each test catches. No looks are replayed: tonight has the runs the night stored.
"""

from __future__ import annotations

import argparse
import statistics
import tomllib
from collections import Counter
from pathlib import Path


from pytest_specdec.gate import verdicts as V
from pytest_specdec.gate.baselines import load
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.sequential import adjust, detectable
from pytest_specdec.gate.scale import kind_of

PROFILES = Path(__file__).resolve().parents[1] / "pytest_specdec" / "profiles"


def replay(files: dict[str, dict], index: int, thresholds: dict[str, float], floor: float = 0.0,
           alpha: float = 0.05) -> tuple[Counter, list[float], str]:
    """(verdict counts per gated metric, speedup MDEs, machine-factor line) with night ``index`` as tonight."""
    base, now = {}, {}
    for path, data in files.items():
        nights = data["sessions"]
        rest = [e for j, e in enumerate(nights) if j != index % len(nights)]
        base[path], now[path] = dict(data, sessions=rest), Night.from_entry(nights[index])
    factors = V.night_factors(base.values())
    nights_var = V.with_floor(V.night_variances(base.values(), factors), floor)
    devs = [d for p in base if (d := V.tonight_deviation(base[p], now[p], factors)) is not None]
    machine = V.machine_factor(devs, thresholds.get("reference_tok_s", 35.0), alpha)
    built = V.build_thresholds(thresholds)
    raw = []
    for path in base:
        raw += [v for v in V.evaluate(base[path], now[path], thresholds=built, alpha=alpha, nights=nights_var,
                                      factors=factors, tonight_log=machine.log if machine else None)
                if v.family == "gated"]
    m = len(files) * len(V.GATED)
    counts: Counter = Counter()
    mdes = []
    for v in adjust(raw, "bh", alpha, family_size=m):
        counts[(v.metric, v.verdict)] += 1
        if v.metric == "speedup" and v.var_fixed is not None and v.var_run is not None and v.n_now:
            mdes.append(detectable(kind_of(v.metric), v.threshold, v.var_fixed + v.var_run / v.n_now,
                                   v.df or 1.0, alpha / m))
    return counts, mdes, machine.line() if machine else "no machine factor"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baselines", type=Path, help="a profile's baseline directory, e.g. baselines/cpu")
    ap.add_argument("--profile", default="cpu", help="the profile whose [verdicts] thresholds apply")
    ap.add_argument("--threshold", action="append", default=[], metavar="METRIC=VALUE")
    args = ap.parse_args(argv)
    paths = sorted(args.baselines.glob("*/*.json"))
    if not paths:
        ap.error(f"no baseline files under {args.baselines}/*/")
    files = {str(p): d for p in paths if (d := load(p, "--update-baselines")) is not None}
    files = {p: d for p, d in files.items() if len(d["sessions"]) >= 3}
    nights = min(len(d["sessions"]) for d in files.values())
    profile = tomllib.loads((PROFILES / f"{args.profile}.toml").read_text())
    thresholds = dict(profile.get("verdicts", {}).get("thresholds", {}))
    floor = float(profile.get("verdicts", {}).get("min_night_sd", 0.0))
    thresholds.update(V.parse_threshold_items(args.threshold, "--threshold"))
    print(f"{len(files)} files with >= 3 nights; thresholds {thresholds}; night sd floor {floor:g} %")
    print("| tonight = night | speedup unchanged / inconclusive / regressed | P95 E2E ratio conclusive "
          "| acceptance conclusive | median speedup drop caught |")
    print("|---|---|---|---|---|")
    for i in range(nights):
        c, mdes, line = replay(files, i, thresholds, floor)
        n = len(files)
        conc = lambda metric: n - c[(metric, "inconclusive")] - c[(metric, "not-comparable")]  # noqa: E731
        print(f"| {i + 1} of {nights} | {c[('speedup', 'unchanged')]} / {c[('speedup', 'inconclusive')]} / "
              f"{c[('speedup', 'regressed')]} of {n} | {conc('e2e_p95_ratio')} of {n} | "
              f"{conc('acceptance_rate')} of {n} | {statistics.median(mdes) if mdes else float('nan'):.1f} % |")
        print(f"<!-- {line} -->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
