"""Run-to-run spread of a session's results: the figures behind README's server-pinning comparison.

    python scripts/run_spread.py reports/specdec-<stamp>.json [...]

Per file: the median (and mean) over tests of the standard deviation of log per-pair speedup, the
median over tests of the sd of log reference tok/s (valid runs), and the number of invalid runs.
"""

from __future__ import annotations

import json
import math
import statistics
import sys


def spread(data: dict) -> dict[str, float]:
    sp_sd, ref_sd, invalid = [], [], 0
    for t in data["tests"]:
        sp = [s for s in (t.get("speedup_per_pair") or []) if s]
        refs = [r["output_tok_s"] for r in t.get("reference_runs") or [] if r.get("valid", True) and r.get("output_tok_s")]
        invalid += sum(1 for r in (t.get("reference_runs") or []) + (t.get("runs") or []) if not r.get("valid", True))
        if len(sp) > 1:
            sp_sd.append(statistics.stdev(math.log(x) for x in sp))
        if len(refs) > 1:
            ref_sd.append(statistics.stdev(math.log(x) for x in refs))
    return {"tests": len(data["tests"]), "speedup_sd_median": statistics.median(sp_sd),
            "speedup_sd_mean": statistics.mean(sp_sd), "reference_sd_median": statistics.median(ref_sd),
            "invalid_runs": invalid}


def main(paths: list[str]) -> int:
    for path in paths:
        with open(path, encoding="utf-8") as f:
            s = spread(json.load(f))
        print(f"{path}: {s['tests']} tests, sd of log speedup per pair median {s['speedup_sd_median']:.3f} "
              f"(mean {s['speedup_sd_mean']:.3f}), sd of log reference tok/s median {s['reference_sd_median']:.3f}, "
              f"{s['invalid_runs']} invalid runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
