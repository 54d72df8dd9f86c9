"""The nights stored in a profile's baseline files, written back as one results file per night, so
`pytest-specdec compare` and `history` can be tried on real measurements without running the suites:

    .venv/bin/python -m scripts.baseline_nights baselines/cpu OUT_DIR
    .venv/bin/pytest-specdec history OUT_DIR
    .venv/bin/pytest-specdec compare OUT_DIR/night-4.json OUT_DIR/night-5.json

`--slow TEXT --factor F --from N` multiplies the spec arm's tok/s (and so the speedup per pair) by F from night
N on, in the tests whose id contains TEXT: a known regression injected into real nights.

A baseline session holds every run the verdicts read (both arms, speedup per pair, validity), rounded to 6
significant digits; a night is every file's session with the same `started`. What a baseline does not keep
(the summary, server commands, per-request texts) is left out of the results file, and the test's `params` are
its comparability record (hardware, model, dataset, workload, sampling, speculation), so compare still says
`not-comparable` where those differ.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pytest_specdec.formats import RESULTS_SCHEMA


def run(stored: dict[str, Any], arm: str) -> dict[str, Any]:
    out = dict(stored)
    drafts, per_pos = stored.get("drafts"), stored.get("accepted_per_pos")
    out["arm"] = arm
    out["per_position_acceptance"] = [a / drafts for a in per_pos] if per_pos and drafts else None
    out["latency_untrusted"] = list(stored.get("latency_untrusted") or [])
    return out


def slow(doc: dict[str, Any], text: str, factor: float) -> int:
    """The spec arm of the tests whose id holds ``text`` made ``factor`` times as fast; returns how many."""
    n = 0
    for test in doc["tests"]:
        if text in test["nodeid"]:
            n += 1
            for r in test["runs"]:
                r["output_tok_s"] = r["output_tok_s"] * factor if r["output_tok_s"] else r["output_tok_s"]
            test["speedup_per_pair"] = [None if x is None else x * factor for x in test["speedup_per_pair"]]
    return n


def nights(root: Path) -> dict[str, dict[str, Any]]:
    """started → a results document of that night's tests."""
    docs: dict[str, dict[str, Any]] = {}
    files = sorted(root.rglob("*.json"))
    if not files:
        raise SystemExit(f"{root}: no baseline files (*.json) under it")
    for path in files:
        data = json.loads(path.read_text())
        for session in data["sessions"]:
            started = session["started"]
            doc = docs.setdefault(started, {
                "schema": RESULTS_SCHEMA, "started": started.replace("Z", "+00:00"), "duration_s": None,
                "profile": data.get("profile"),
                "environment": {"hardware": data["comparability"].get("hardware"),
                                "vllm_version": (session.get("under_test") or {}).get("vllm"),
                                "target_model": (data["comparability"].get("target") or {}).get("id"),
                                "workarounds": []},
                "servers": {}, "datasets": {}, "tests": []})
            doc["tests"].append({
                "nodeid": data["nodeid"], "params": data["comparability"], "outcome": "passed", "when": "call",
                "runs": [run(r, "spec") for r in session["runs"]["spec"]],
                "reference_runs": [run(r, "reference") for r in session["runs"]["reference"]],
                "speedup_per_pair": session.get("speedup_per_pair") or [], "summary": {},
                "validity": {"valid": all(r["valid"] for arm in session["runs"].values() for r in arm)},
            })
    return dict(sorted(docs.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("baselines", type=Path, help="a profile's baseline folder, e.g. baselines/cpu")
    ap.add_argument("out", type=Path, help="where night-1.json, night-2.json, ... are written")
    ap.add_argument("--slow", metavar="TEXT", help="inject a slower spec arm into the tests whose id holds TEXT")
    ap.add_argument("--factor", type=float, default=0.6, help="the spec arm's speed factor (default 0.6)")
    ap.add_argument("--from", dest="start", type=int, default=4, metavar="N", help="from night N on (default 4)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for i, (started, doc) in enumerate(nights(args.baselines).items(), start=1):
        note = ""
        if args.slow and i >= args.start:
            note = f"; spec arm x{args.factor:g} in {slow(doc, args.slow, args.factor)} test(s)"
        path = args.out / f"night-{i}.json"
        path.write_text(json.dumps(doc, indent=1))
        print(f"{path}: {started}, {len(doc['tests'])} test(s){note}")


if __name__ == "__main__":
    main()
