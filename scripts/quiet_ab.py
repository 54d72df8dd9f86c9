"""Does waiting for idle servers before each run change what the cpu profile measures?

    .venv/bin/python scripts/quiet_ab.py [--concurrency 8] [--blocks 6]

Starts the cpu profile's reference (`none`) and eagle3 k=3 servers side by side, as a test does, warms
both up, then runs ABBA blocks: in each block one reference/spec pair with the plugin's idle wait
(`server.wait_quiet` before every run) and one without, in alternating order.  8 built-in prompts of at
most 64 tokens (the cpu profile's matrix).  Prints every pair and, per condition, the median tok/s of
each arm, the median speedup and the sd of the logs (the README's "Idle servers before each run").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_specdec.measure.datasets import builtin  # noqa: E402
from pytest_specdec.measure.types import Sampling  # noqa: E402
from pytest_specdec.measure.client import served_model
from pytest_specdec.measure.runner import ValidityRules, one_run  # noqa: E402
from pytest_specdec.servers.pool import Endpoint  # noqa: E402
from pytest_specdec.profiles import load_profile, server_spec  # noqa: E402
from pytest_specdec.servers.process import VllmServer, wait_quiet  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=8, help="(default: %(default)s)")
    ap.add_argument("--blocks", type=int, default=6, help="ABBA blocks, each a pair with and one without (default: %(default)s)")
    args = ap.parse_args(argv)
    profile = load_profile("cpu")
    prompts = [dataclasses.replace(p, max_tokens=min(p.max_tokens, 64)) for p in builtin().prompts[:8]]
    rules = ValidityRules(max_loop_lag_mean_ms=1e9)  # report the lag, keep every run
    sampling = Sampling(temperature=0.0)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as logs, \
            VllmServer(server_spec(profile, "none", None), log_dir=Path(logs)) as ref, \
            VllmServer(server_spec(profile, "eagle3", 3), log_dir=Path(logs)) as spec:
        servers = {"reference": ref, "spec": spec}
        eps = {a: Endpoint(s.base_url, served_model(s.base_url), owned=True) for a, s in servers.items()}
        pgids = {s.proc.pid for s in servers.values() if s.proc is not None}
        for arm, ep in eps.items():
            one_run(ep, arm, -1, prompts[:4], sampling, concurrency=4, api_key=None, rules=rules)
        for b in range(args.blocks):
            for wait in ((False, True) if b % 2 == 0 else (True, False)):
                row: dict[str, object] = {"block": b, "wait": wait}
                for arm, ep in eps.items():
                    if wait:
                        row[f"{arm}_waited_s"] = round(wait_quiet(pgids).waited_s, 2)
                    m = one_run(ep, arm, b, prompts, sampling, concurrency=args.concurrency, api_key=None,
                                rules=rules).metrics
                    row[arm], row[f"{arm}_lag_ms"] = m.output_tok_s, m.loop_lag_mean_ms
                row["speedup"] = row["spec"] / row["reference"]  # type: ignore[operator]
                rows.append(row)
                print(json.dumps(row), flush=True)
    for wait in (False, True):
        sel = [r for r in rows if r["wait"] is wait]

        def med(key: str) -> float:
            return statistics.median(float(r[key]) for r in sel)  # type: ignore[arg-type]

        def sdlog(key: str) -> float:
            return statistics.stdev(math.log(float(r[key])) for r in sel)  # type: ignore[arg-type]

        print(f"{'with' if wait else 'without'} the wait: reference tok/s median {med('reference'):.0f} "
              f"(sd log {sdlog('reference'):.3f}), spec {med('spec'):.0f} ({sdlog('spec'):.3f}), "
              f"speedup {med('speedup'):.3f} ({sdlog('speedup'):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
