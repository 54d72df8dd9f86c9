"""A session's measurement traps from its results JSON: invalid runs, coalesced runs, and at concurrency 1
each test's reference TTFT P95 against its spec arm's (docs/validation.md, "Measurement traps").

    .venv/bin/python -m scripts.latency_check reports/latest.json

Per c=1 test: the largest TTFT P95 of the reference arm's trusted runs, the largest of the spec arm's,
their ratio, and the runs flagged as coalesced (their latency is left out of everything).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_specdec.output.schema import load


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a session's results JSON, e.g. reports/latest.json")
    args = ap.parse_args(argv)
    tests = load(json.loads(args.results.read_text()), str(args.results)).tests
    invalid = [(t.nodeid, r["arm"], r["index"], r["reasons"]) for t in tests for r in t.invalid_runs]
    coalesced = [(t.nodeid, r["arm"], r["index"], r["reasons"]) for t in tests for r in t.latency_untrusted_runs]
    print(f"{len(tests)} tests; {len(invalid)} invalid run(s); {len(coalesced)} coalesced run(s)")
    for nodeid, arm, index, reasons in invalid + coalesced:
        print(f"  {nodeid} {arm} run {index + 1}: {'; '.join(reasons)}")
    worst = 0.0
    for t in tests:
        if t.params.get("concurrency") != 1 or not t.runs:
            continue

        def p95s(runs: tuple[Mapping[str, Any], ...]) -> list[float]:
            return [r["ttft_ms"]["p95"] for r in runs if r["valid"] and not r["latency_untrusted"] and r.get("ttft_ms")]

        ref, spec = p95s(t.reference_runs), p95s(t.runs)
        if not ref or not spec:
            print(f"  {t.nodeid}: no trusted runs in an arm")
            continue
        ratio = max(ref) / max(spec)
        worst = max(worst, ratio)
        flagged = [f"{r['arm']} {r['index'] + 1}" for r in t.reference_runs + t.runs if r["latency_untrusted"]]
        print(f"  {t.nodeid}: reference TTFT P95 max {max(ref):.0f} ms, spec {max(spec):.0f} ms, ratio {ratio:.2f}"
              + (f"; coalesced: {', '.join(flagged)}" if flagged else ""))
    print(f"largest reference/spec TTFT P95 ratio at c=1: {worst:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
