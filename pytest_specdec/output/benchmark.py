"""The session's results as a pytest-benchmark JSON file (--specdec-benchmark-json), from the typed results."""

from __future__ import annotations

from typing import Any

from pytest_specdec.output.fields import number, test_name
from pytest_specdec.output.schema import load

#: (name suffix, group, run field → seconds): lower is better, as pytest-benchmark assumes.
BENCH_METRICS = (
    ("s_per_output_token", "seconds per output token",
     lambda r: 1.0 / r["output_tok_s"] if number(r.get("output_tok_s")) else None),
    ("tpot_p50", "TPOT P50 (s)", lambda r: (r.get("tpot_ms") or {}).get("p50") and r["tpot_ms"]["p50"] / 1000),
    ("e2e_p50", "E2E P50 (s)", lambda r: (r.get("e2e_ms") or {}).get("p50") and r["e2e_ms"]["p50"] / 1000),
)


def benchmark_json(data: Any, *, machine_info: dict[str, Any] | None = None,
                   commit_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The session's valid runs as a pytest-benchmark JSON file: one benchmark per test, arm and metric,
    its per-run values as `stats.data`. Statistics, machine and commit info come from pytest-benchmark's
    own code; vLLM's version and the draft/head revisions go in `extra_info` (commit_info is the suite's)."""
    from pytest_specdec.errors import import_extra

    feature = "--specdec-benchmark-json"
    bench_version = import_extra("pytest_benchmark", feature).__version__
    # No public helper builds machine_info (pytest-benchmark 5.3): its plugin's hook implementation does.
    pytest_benchmark_generate_machine_info = import_extra("pytest_benchmark.plugin", feature
                                                          ).pytest_benchmark_generate_machine_info
    Stats = import_extra("pytest_benchmark.stats", feature).Stats
    from pytest_specdec.output.commit import commit_info as suite_commit

    results = load(data)
    env = results.environment
    benchmarks = []
    for test in results.tests:
        base, ident = test_name(test.nodeid)
        params = test.params
        under = test.baseline.under_test if test.baseline else {}
        spec_key = test.servers.get("spec")
        spec_config = (results.servers.get(spec_key, {}).get("engine_config") or {}).get("speculative_config") \
            if spec_key else None
        extra = {"vllm_version": env.get("vllm_version"), "vllm_distribution": env.get("vllm_distribution"),
                 "draft": under.get("draft"), "speculative_config": spec_config,
                 "hardware": env.get("hardware"), "profile": results.profile,
                 "summary": {k: test.summary.get(k) for k in ("speedup", "acceptance_rate")}}
        for arm, runs in (("spec", test.runs), ("reference", test.reference_runs)):
            valid = [r for r in runs if r["valid"]]
            for suffix, group, get in BENCH_METRICS:
                values = [x for x in (number(get(r)) for r in valid) if x is not None]
                if not values:
                    continue
                stats = Stats()
                for v in values:
                    stats.update(v)
                name = f"{base.rsplit('::', 1)[-1]}[{ident}]::{arm}::{suffix}"
                benchmarks.append({
                    "group": group, "name": name, "fullname": f"{test.nodeid}::{arm}::{suffix}",
                    "params": {**{k: v for k, v in params.items() if not isinstance(v, dict)}, "arm": arm},
                    "param": f"{ident}-{arm}", "extra_info": {**extra, "arm": arm},
                    "options": {"disable_gc": False, "timer": "wall clock of a vLLM run", "min_rounds": len(values),
                                "max_time": None, "min_time": None, "warmup": True},
                    "stats": {**stats.as_dict(), "data": values, "iterations": 1},
                })
    return {
        "machine_info": machine_info if machine_info is not None else {
            **pytest_benchmark_generate_machine_info(), "specdec_hardware": env.get("hardware")},
        "commit_info": commit_info if commit_info is not None else (env.get("commit") or suite_commit() or {}),
        "benchmarks": benchmarks, "datetime": results.started or None, "version": bench_version,
    }
