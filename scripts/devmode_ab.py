"""Does VLLM_SERVER_DEV_MODE=1 (which the plugin sets to read /server_info) change throughput?

Two reference servers of the cpu profile, identical but for that variable, measured in interleaved
pairs with the plugin's own measurement code (the idle wait before every run); "speedup" here is
dev-mode tok/s ÷ plain tok/s.

    .venv/bin/python scripts/devmode_ab.py [--pairs 8] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
from pathlib import Path

from pytest_specdec.measure.datasets import builtin
from pytest_specdec.measure.types import Sampling
from pytest_specdec.measure.client import served_model
from pytest_specdec.measure.runner import measure_case
from pytest_specdec.servers.pool import Endpoint, ServerPool
from pytest_specdec.profiles import load_profile, server_spec
from pytest_specdec.vllm.engine_config import DEV_MODE_ENV


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()
    profile = load_profile("cpu")
    base = server_spec(profile, "none", None)
    plain = dataclasses.replace(base, env=tuple(sorted({**dict(base.env), DEV_MODE_ENV: "0"}.items())))
    dev = base  # the pool's servers get VLLM_SERVER_DEV_MODE=1 on loopback
    prompts = [dataclasses.replace(p, max_tokens=64) for p in builtin().prompts[:8]]
    with tempfile.TemporaryDirectory() as logs:
        pool = ServerPool(Path(logs), max_alive=2, startup_timeout_s=600, progress=print)
        try:
            a, b = pool.get(plain), pool.get(dev)
            ea = Endpoint(a.base_url, served_model(a.base_url), owned=True, instance="plain")
            eb = Endpoint(b.base_url, served_model(b.base_url), owned=True, instance="dev")
            print("engine config sources:", a.engine_config().get("config_source"), b.engine_config().get("config_source"))
            result = measure_case(ea, eb, prompts, Sampling(temperature=0.0), concurrency=args.concurrency,
                                  runs=args.pairs, progress=print, settle=lambda: pool.wait_quiet(3.0))
        finally:
            pool.stop_all()
    ratios = [r for r in result.speedup_per_pair if r]
    logs_ = [math.log(r) for r in ratios]
    m, sd = statistics.mean(logs_), statistics.stdev(logs_)
    from scipy.stats import t

    half = t.ppf(0.95, len(logs_) - 1) * sd / math.sqrt(len(logs_))
    print(f"dev/plain tok/s over {len(ratios)} pairs: {math.exp(m):.3f} "
          f"(90% CI {math.exp(m - half):.3f}-{math.exp(m + half):.3f})")


if __name__ == "__main__":
    main()
