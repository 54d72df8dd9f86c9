"""TTFT of the no-spec server against a second server, interleaved at c=1 (the suites' reference arm shows
TTFT P95 of 150-300 ms in some runs where the spec arm stays near 25 ms).

    .venv/bin/python scripts/ttft_ab.py           # two identical reference servers
    .venv/bin/python scripts/ttft_ab.py eagle3    # the reference server and the cpu profile's eagle3 k=3

Prints, per run of each arm: TTFT P50 and P95 (ms) and output tok/s.
"""
import dataclasses, tempfile, sys
from pathlib import Path
from pytest_specdec.datasets import builtin
from pytest_specdec.load import Sampling, served_model
from pytest_specdec.measurement import measure_case
from pytest_specdec.pool import Endpoint, ServerPool
from pytest_specdec.profiles import load_profile, server_spec

profile = load_profile("cpu")
ref = server_spec(profile, "none", None)
other = server_spec(profile, sys.argv[1], 3) if len(sys.argv) > 1 else dataclasses.replace(ref, env=tuple(sorted({**dict(ref.env), "X_TWIN": "1"}.items())))
prompts = [dataclasses.replace(p, max_tokens=64) for p in builtin().prompts[:8]]
with tempfile.TemporaryDirectory() as logs:
    pool = ServerPool(Path(logs), max_alive=2, startup_timeout_s=600, progress=lambda l: None)
    try:
        a, b = pool.get(ref), pool.get(other)
        ea = Endpoint(a.base_url, served_model(a.base_url), owned=True, instance="a")
        eb = Endpoint(b.base_url, served_model(b.base_url), owned=True, instance="b")
        r = measure_case(ea, eb, prompts, Sampling(temperature=0.0), concurrency=1, runs=6,
                         settle=lambda: pool.wait_quiet(3.0))
        for arm, runs in (("first (none)", r.reference_runs), ("second", r.runs)):
            print(arm, [(round(x.metrics.ttft_ms["p50"]), round(x.metrics.ttft_ms["p95"]), round(x.metrics.output_tok_s)) for x in runs])
    finally:
        pool.stop_all()
