"""Endpoint mode against two hand-started vLLM CPU servers, next to `vllm bench serve` on the same server
(docs/measurement.md, "Endpoint mode").

    .venv/bin/python -m scripts.endpoint_vs_bench [--rounds 3] [--settle-timeout 3]

Starts the zoo target twice the way a user would from a shell (own session, default priority, not the
plugin's pool): with ngram k=3, and with no speculation. Both have prefix caching off, because
`vllm bench serve` sends no cache_salt and would otherwise hit its own earlier prompts. After one warm-up
of each client, every round runs, in alternating order (ABBA):

* a pytest session in endpoint mode (`--specdec-endpoint`, `--specdec-reference-endpoint`), one
  interleaved pair of 32 built-in prompts at concurrency 4 with at most 96 output tokens;
* `vllm bench serve` against the spec server with the same prompts, concurrency and output lengths.

Prints per round the spec arm's tok/s by each client, their ratio, and the plugin's client-bound or
invalid runs, coalesced streams and settle step; then the totals.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from pytest_specdec.output.schema import load
from scripts.vllm_bench import bench_command, bench_prompts_file, run_bench

SUITE = """
import pytest

@pytest.mark.specdec(method="ngram", k=3, temperature=0.0, concurrency=4, num_prompts=32, max_tokens=96)
@pytest.mark.specdec_verdicts(check=False)
def test_endpoint(specdec):
    pass
"""


def main(argv: list[str] | None = None) -> int:
    from pytest_specdec.measure.datasets import builtin
    from pytest_specdec.profiles import load_profile, server_spec
    from pytest_specdec.servers.http import served_model
    from pytest_specdec.servers.process import VllmServer
    from pytest_specdec.zoo import zoo_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle-timeout", default="3", help="the plugin's --specdec-settle-timeout (0: no settle)")
    args = ap.parse_args(argv)
    profile = load_profile("cpu")
    no_cache = ("--no-enable-prefix-caching",)
    spec = server_spec(profile, "ngram", 3)
    spec = dataclasses.replace(spec, args=(*spec.args, *no_cache))
    ref = server_spec(profile, "none", None)
    ref = dataclasses.replace(ref, args=(*ref.args, *no_cache))
    prompts = [dataclasses.replace(p, max_tokens=min(p.max_tokens, 96)) for p in builtin().prompts[:32]]
    env = {**os.environ, **dict(spec.env)}
    tmp = Path(tempfile.mkdtemp(prefix="endpoint-vs-bench-"))
    (tmp / "test_endpoint.py").write_text(textwrap.dedent(SUITE))
    data = tmp / "prompts.jsonl"
    bench_prompts_file(prompts, data)
    rows: list[dict[str, Any]] = []
    with VllmServer(spec, log_dir=tmp / "logs") as s_srv, VllmServer(ref, log_dir=tmp / "logs") as r_srv:
        model = served_model(s_srv.base_url)

        def plugin(i: int) -> dict[str, object]:
            reports = tmp / f"reports-{i}"
            cmd = [sys.executable, "-m", "pytest", str(tmp / "test_endpoint.py"), "-p", "no:cacheprovider",
                   "-p", "no:randomly", "--specdec-profile=cpu", f"--specdec-endpoint={s_srv.base_url}",
                   f"--specdec-reference-endpoint={r_srv.base_url}", "--specdec-runs=1",
                   f"--specdec-settle-timeout={args.settle_timeout}", f"--specdec-reports-dir={reports}",
                   f"--rootdir={tmp}", "-q"]
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"pytest failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
            test = load(json.loads((reports / "latest.json").read_text()), str(reports / "latest.json")).tests[0]
            runs = [*test.reference_runs, *test.runs]
            return {"tok_s": test.runs[0]["output_tok_s"], "ref_tok_s": test.reference_runs[0]["output_tok_s"],
                    "invalid": [f"{r['arm']}: {'; '.join(r['invalid_reasons'])}" for r in runs if not r["valid"]],
                    "coalesced": [r["arm"] for r in runs if r["latency_untrusted"]],
                    "lag_ms": [round(r["loop_lag_mean_ms"], 1) for r in runs],
                    "settle": [r["settle"] for r in runs]}

        def bench(i: int) -> float:
            name = f"bench-{i}.json"
            cmd = bench_command(s_srv.base_url, model, str(zoo_path("target")), data, len(prompts), 4, 0.0, tmp, name)
            result, _ = run_bench(cmd, env, tmp / name)
            return float(result["output_throughput"])

        print(f"servers ready; warm-up (results in {tmp})", flush=True)
        plugin(0)
        bench(0)
        for i in range(1, args.rounds + 1):
            order = ("plugin", "bench") if i % 2 else ("bench", "plugin")
            row: dict[str, Any] = {"round": i, "order": "/".join(order)}
            for who in order:
                if who == "plugin":
                    row.update(plugin(i))
                else:
                    row["bench_tok_s"] = bench(i)
            ratio = float(row["tok_s"]) / float(row["bench_tok_s"])
            row["ratio"] = ratio
            rows.append(row)
            print(f"round {i} ({row['order']}): plugin spec {row['tok_s']:.0f} tok/s, bench serve "
                  f"{row['bench_tok_s']:.0f} tok/s, ratio {ratio:.3f}; reference {row['ref_tok_s']:.0f} tok/s; "
                  f"loop lag mean {row['lag_ms']} ms; invalid {row['invalid'] or 'none'}; coalesced "
                  f"{row['coalesced'] or 'none'}; settle {row['settle']}", flush=True)
    ratios = [float(r["ratio"]) for r in rows]
    bound = sum(1 for r in rows for x in r["invalid"] if "client event loop lagged" in x)
    print(f"\nplugin ÷ bench serve, spec tok/s: {', '.join(f'{x:.3f}' for x in ratios)} "
          f"(worst {max(abs(1 - x) for x in ratios):.1%} off); client-bound runs {bound} of {2 * len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
