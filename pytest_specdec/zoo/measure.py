"""Measure how realistic the zoo is on real vLLM CPU: `python -m pytest_specdec.zoo.measure`.

For each zoo method (none, ngram, draft_model, eagle3, eagle3-degraded, and draft-slow, greedy at
concurrency 1 only, against draft_model) at k=3 it starts one vLLM server from the `cpu` profile and
measures, through vLLM's /metrics counters:
acceptance rate and per-position acceptance at temperature 0 and 1.0, ngram acceptance per prompt
category, output tok/s at concurrency 1 and 8, and whether spec output equals the reference
(method `none`) output at temperature 0.  It also starts eagle3 once more *without* the CPU
temperature fix to show the collapse the fix repairs.  EOS is honoured (no ignore_eos).

The integration test (tests/real_vllm/test_zoo_vllm.py) calls `measure()` and checks the ranges; the
table in docs/cpu-default.md is this command's markdown output. It lives beside the zoo, outside the
plugin's import path: nothing the plugin imports imports this module (or the trainer's torch).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec import redact
from pytest_specdec.output.schema import run_metrics_entry

if TYPE_CHECKING:
    from pytest_specdec.measure.runner import RunRecord
    from pytest_specdec.measure.validity import ValidityRules
    from pytest_specdec.profiles import Profile

K = 3
ZOO_METHODS = ("none", "ngram", "draft_model", "eagle3", "eagle3-degraded", "draft-slow")
#: A variant that must give its twin's tokens and acceptance, only slower: measured greedy at c=1 only.
#: `draft-slow10` and `draft-slow20` are not in ZOO_METHODS (fewer servers by default); `--methods` measures them.
TWINS = {"draft-slow": "draft_model", "draft-slow10": "draft_model", "draft-slow20": "draft_model"}
PROSE = ("short_qa", "summarization", "creative_writing", "translation", "reasoning")
CODE_EDIT = ("code_editing",)
#: The first 32 built-in prompts: the set docs/cpu-default.md's zoo table was measured with (the built-in set
#: grew to 128 later; its first 32 lines are unchanged).
ZOO_PROMPTS = 32


@dataclass
class MethodResult:
    """What one server (one method) gave."""

    method: str
    startup_s: float
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run label -> RunMetrics dict
    texts_t0: dict[str, str] = field(default_factory=dict)
    workarounds: list[dict[str, Any]] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    #: A twin's interleaved greedy c=1 runs against its base (`measure_with_twins`); empty for other methods
    timing_pairs: list[dict[str, Any]] = field(default_factory=list)


#: Interleaved timing pairs of each twin against its base, both servers up (`measure_with_twins`).
TWIN_PAIRS = 3

#: Attempts per throughput point when the only invalid reason is a lagging client event loop.
LAG_ATTEMPTS = 3


def _only_client_lag(reasons: Sequence[str]) -> bool:
    """True when a run is invalid only because the client's event loop lagged (a starved client)."""
    from pytest_specdec.measure.validity import CLIENT_LAG

    return bool(reasons) and all(r.startswith(CLIENT_LAG) for r in reasons)


def server_cpus() -> frozenset[int] | None:
    """The CPU the zoo's servers start on: the last one this process may use, leaving the others to the
    client (vLLM's CPU worker then binds itself to that CPU too).

    Why: on 2 cores, with vLLM's worker pinned to core 0 and its busy-waiting engine core (and, for
    ngram, its proposer) free to float, the client's event loop stalled for up to 2 s in CI and made
    ngram runs invalid three times in a row; with the server started on core 1, `python -m
    scripts.vs_bench_serve ab --server-cpus 1` measured no half-speed runs.  None on a 1-CPU machine (nothing to
    separate).
    """
    import os

    cpus = sorted(os.sched_getaffinity(0))
    return frozenset(cpus[-1:]) if len(cpus) >= 2 else None


def _run(
    server: Any, model: str, prompts: list[Any], temperature: float, concurrency: int, rules: ValidityRules
) -> RunRecord:
    from pytest_specdec.measure.runner import one_run
    from pytest_specdec.measure.types import Sampling
    from pytest_specdec.servers.pool import Endpoint

    return one_run(
        Endpoint(server.base_url, model, owned=True), "spec", 0, prompts, Sampling(temperature=temperature),
        concurrency=concurrency, api_key=None, rules=rules,
    )


@functools.cache
def _cpu_profile() -> Profile:
    """The `cpu` profile every zoo server starts from and every run's validity rules come from, read once."""
    from pytest_specdec.profiles import load_profile

    return load_profile("cpu")


@contextmanager
def _serving(method: str, prompts: list[Any], log_dir: Path, *, fix: bool,
             progress: Any) -> Iterator[tuple[Any, str, MethodResult]]:
    """Start the server for `method` from the `cpu` profile, warm it up on the first 4 `prompts`, yield it with its
    model and the result to fill, record its workarounds, stop it (always)."""
    from pytest_specdec.profiles import server_spec
    from pytest_specdec.servers.http import served_model
    from pytest_specdec.servers.process import VllmServer

    profile = _cpu_profile()
    env = None if fix else {"SPECDEC_VLLM_CPU_FIX": "0"}
    spec = server_spec(profile, method, None if method == "none" else K, extra_env=env)
    server = VllmServer(spec, log_dir=log_dir, cpus=server_cpus())
    label = method if fix else f"{method} (no fix)"
    progress(f"[zoo] starting vLLM for {label} ...")
    with server:
        assert server.startup_s is not None
        progress(f"[zoo] {label}: ready in {server.startup_s:.0f} s at {server.base_url}")
        result = MethodResult(method=label, startup_s=server.startup_s, command=server.command)
        model = served_model(server.base_url, server.api_key)
        # Warm-up: the first requests of a fresh server compile new shapes.
        _run(server, model, prompts[:4], 0.0, 4, profile.validity)
        yield server, model, result
        result.workarounds = server.workarounds()


def _greedy_run(server: Any, model: str, prompts: list[Any], concurrency: int, rules: ValidityRules,
                label: str, progress: Any) -> tuple[RunRecord, list[dict[str, Any]]]:
    """One greedy (throughput) run, taken again up to LAG_ATTEMPTS in all while the client's event loop lagged.

    On 2 shared cores a busy moment starves the client's event loop and invalidates a run's timing (not its
    counters or texts); every earlier attempt is returned to be kept in the summary."""
    earlier: list[dict[str, Any]] = []
    run = _run(server, model, prompts, 0.0, concurrency, rules)
    while _only_client_lag(run.invalid) and len(earlier) + 1 < LAG_ATTEMPTS:
        earlier.append({"output_tok_s": run.metrics.output_tok_s, "invalid_reasons": list(run.invalid)})
        progress(f"[zoo] {label} greedy c={concurrency}: client-bound ({run.invalid[0]}), measuring again")
        run = _run(server, model, prompts, 0.0, concurrency, rules)
    return run, earlier


def _measure_points(server: Any, model: str, result: MethodResult, prompts: list[Any], *,
                    temperatures: tuple[float, ...], concurrencies: tuple[int, ...], per_category: bool,
                    progress: Any) -> None:
    """Throughput at every concurrency for greedy decoding; T > 0 only at the first (acceptance)."""
    rules = _cpu_profile().validity
    points = [(0.0, c) for c in concurrencies if 0.0 in temperatures]
    points += [(t, concurrencies[0]) for t in temperatures if t != 0.0]
    for temperature, concurrency in points:
        t0 = time.monotonic()
        key = f"t{temperature}-c{concurrency}"
        if temperature == 0.0:
            run, earlier = _greedy_run(server, model, prompts, concurrency, rules, result.method, progress)
        else:
            run, earlier = _run(server, model, prompts, temperature, concurrency, rules), []
        result.runs[key] = {**run_metrics_entry(run.metrics), "invalid_reasons": list(run.invalid),
                            "earlier_attempts": earlier}
        if temperature == 0.0 and concurrency == 1:
            result.texts_t0 = dict(run.texts)
        m = result.runs[key]
        progress(
            f"[zoo] {result.method} {key}: {m['output_tok_s']:.1f} tok/s, acceptance "
            f"{_fmt(m.get('acceptance_rate'))} per position {_fmt_list(m.get('per_position_acceptance'))}"
            f" ({time.monotonic() - t0:.0f} s)"
        )
    if per_category:
        for name, cats in (("prose", PROSE), ("code_editing", CODE_EDIT)):
            subset = [p for p in prompts if p.category in cats]
            run = _run(server, model, subset, 0.0, 1, rules)
            result.runs[f"t0.0-c1-{name}"] = {**run_metrics_entry(run.metrics), "invalid_reasons": list(run.invalid)}


def measure_method(
    method: str,
    prompts: list[Any],
    log_dir: Path,
    *,
    fix: bool = True,
    temperatures: tuple[float, ...] = (0.0, 1.0),
    concurrencies: tuple[int, ...] = (1, 8),
    per_category: bool = False,
    progress: Any = print,
) -> MethodResult:
    """Start the server for `method`, warm it up, measure the runs, stop it (always)."""
    with _serving(method, prompts, log_dir, fix=fix, progress=progress) as (server, model, result):
        _measure_points(server, model, result, prompts, temperatures=temperatures, concurrencies=concurrencies,
                        per_category=per_category, progress=progress)
    return result


def _timing_pairs(base: tuple[Any, str, MethodResult], twin: tuple[Any, str, MethodResult], prompts: list[Any],
                  pairs: int, progress: Any) -> list[dict[str, Any]]:
    """`pairs` interleaved greedy c=1 runs of a twin and its base, both servers up, the lead swapped from pair to
    pair, each run after the other server has gone idle (`servers.quiet.wait_idle`, as the gate's runs wait).

    Why: on a host whose speed swings within minutes, one run of each server minutes apart measured the slow
    draft from -44 % to -13 % (the 0.85 check failed once in CI); a pair's two runs seconds apart see one state."""
    from pytest_specdec.output.schema import quiet_entry
    from pytest_specdec.servers.quiet import requests_held, wait_idle

    rules = _cpu_profile().validity
    arms = {"base": base, "twin": twin}
    both = [(s.base_url, s.api_key) for s, _, _ in arms.values()]
    out: list[dict[str, Any]] = []
    for i in range(pairs):
        order = ("base", "twin") if i % 2 == 0 else ("twin", "base")
        pair: dict[str, Any] = {"first": order[0]}
        for arm in order:
            server, model, result = arms[arm]
            other = arms["twin" if arm == "base" else "base"][0]
            quiet = wait_idle({other.proc.pid}, timeout_s=3.0, requests=lambda: requests_held(both))
            run, earlier = _greedy_run(server, model, prompts, 1, rules, result.method, progress)
            pair[arm] = {"output_tok_s": run.metrics.output_tok_s, "invalid_reasons": list(run.invalid),
                         "earlier_attempts": earlier, "quiet": quiet_entry(quiet)}
        progress(f"[zoo] {twin[2].method} vs {base[2].method}, pair {i + 1}/{pairs}: "
                 f"{pair['twin']['output_tok_s']:.1f} vs {pair['base']['output_tok_s']:.1f} tok/s")
        out.append(pair)
    return out


def measure_with_twins(base: str, twins: tuple[str, ...], prompts: list[Any], log_dir: Path, *,
                       temperatures: tuple[float, ...], concurrencies: tuple[int, ...], pairs: int = TWIN_PAIRS,
                       pair_prompts: int | None = None, progress: Any = print) -> dict[str, MethodResult]:
    """Measure `base` as `measure_method` does, then, its server still up, each twin greedy at c=1 and in
    `pairs` interleaved timing pairs against it (`MethodResult.timing_pairs`), each run on the first
    ``pair_prompts`` prompts (None: all)."""
    results: dict[str, MethodResult] = {}
    with _serving(base, prompts, log_dir, fix=True, progress=progress) as served_base:
        _measure_points(*served_base, prompts, temperatures=temperatures, concurrencies=concurrencies,
                        per_category=False, progress=progress)
        results[base] = served_base[2]
        for twin in twins:
            with _serving(twin, prompts, log_dir, fix=True, progress=progress) as served_twin:
                _measure_points(*served_twin, prompts, temperatures=(0.0,), concurrencies=(1,),
                                per_category=False, progress=progress)
                served_twin[2].timing_pairs = _timing_pairs(served_base, served_twin, prompts[:pair_prompts], pairs,
                                                            progress)
            results[twin] = served_twin[2]
    return results


def twin_speed(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """A twin's output tok/s against its base from the timing pairs: each valid pair's ratio and their geometric
    mean (None when no pair is valid). A pair with an invalid run is kept, named, and left out of the mean."""
    ratios = [p["twin"]["output_tok_s"] / p["base"]["output_tok_s"]
              if not p["twin"]["invalid_reasons"] and not p["base"]["invalid_reasons"] else None for p in pairs]
    valid = [r for r in ratios if r is not None]
    mean = math.exp(sum(math.log(r) for r in valid) / len(valid)) if valid else None
    return {"ratios": ratios, "geometric_mean": mean, "valid_pairs": len(valid), "pairs": len(pairs)}


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _fmt_list(xs: list[float] | None) -> str:
    return "—" if not xs else "/".join(f"{x:.2f}" for x in xs)


def output_match(reference: dict[str, str], spec: dict[str, str]) -> float | None:
    """Share of prompts whose spec output text equals the reference output text."""
    common = [pid for pid in reference if pid in spec]
    if not common:
        return None
    return sum(reference[p] == spec[p] for p in common) / len(common)


def measure(
    log_dir: Path,
    methods: tuple[str, ...] = ZOO_METHODS,
    n_prompts: int | None = None,
    stride: int = 1,
    no_fix_method: str | None = "eagle3",
    concurrencies: tuple[int, ...] = (1, 8),
    progress: Any = print,
    per_category: bool = True,
    hot: tuple[str, ...] | None = None,
    pair_prompts: int | None = None,
) -> dict[str, Any]:
    """Measure every method (and the no-fix control); return a JSON-able summary. ``per_category``: ngram's
    acceptance on prose and on code editing too (two more passes; the README table's line). ``hot``: the
    methods measured at T = 1 too (None: every method that drafts on its own). ``pair_prompts``: the prompts of
    each run of a twin's timing pairs (None: all of them)."""
    from pytest_specdec.measure.datasets import builtin

    dataset = builtin()
    # every `stride`-th of the first n: fewer prompts that still span the categories (prose and code editing)
    prompts = list(dataset.prompts[:n_prompts or ZOO_PROMPTS])[::stride]
    results: dict[str, MethodResult] = {}
    # A twin whose base is measured too is measured beside it, in interleaved timing pairs (`measure_with_twins`).
    paired = {twin for twin in methods if twin in TWINS and TWINS[twin] in methods}
    for method in methods:
        if method in paired:
            continue
        twin = method in TWINS
        # T > 0 is measured for acceptance: not for the reference (no drafts) nor a twin (same drafts)
        at_t1 = not twin and method != "none" and (hot is None or method in hot)
        temperatures = (0.0, 1.0) if at_t1 else (0.0,)
        its_twins = tuple(t for t in methods if t in paired and TWINS[t] == method)
        if its_twins:
            results.update(measure_with_twins(method, its_twins, prompts, log_dir, temperatures=temperatures,
                                              concurrencies=concurrencies, pair_prompts=pair_prompts,
                                              progress=progress))
            continue
        results[method] = measure_method(
            method, prompts, log_dir, temperatures=temperatures,
            concurrencies=concurrencies[:1] if twin else concurrencies,
            per_category=per_category and method == "ngram", progress=progress,
        )
    if no_fix_method:
        results[f"{no_fix_method} (no fix)"] = measure_method(
            no_fix_method, prompts, log_dir, fix=False, temperatures=(1.0,), concurrencies=(1,),
            progress=progress,
        )
    reference_texts = results["none"].texts_t0 if "none" in results else {}
    summary: dict[str, Any] = {
        "k": K,
        "server_cpus": sorted(server_cpus() or []),
        "prompts": len(prompts),
        "dataset_sha256": dataset.sha256,
        "max_tokens": sorted({p.max_tokens for p in prompts}),
        "methods": {},
    }
    for name, res in results.items():
        entry: dict[str, Any] = {
            "startup_s": round(res.startup_s, 1),
            "runs": res.runs,
            "workarounds": res.workarounds,
            "command": redact.args(res.command),  # the summary is written and shared
        }
        if reference_texts and res.texts_t0 and name != "none":
            entry["output_match_t0"] = output_match(reference_texts, res.texts_t0)
        if name in TWINS and TWINS[name] in results:
            entry["output_match_twin_t0"] = output_match(results[TWINS[name]].texts_t0, res.texts_t0)
        if res.timing_pairs:
            entry["timing_pairs"] = res.timing_pairs
            entry["speed_vs_twin"] = twin_speed(res.timing_pairs)
        summary["methods"][name] = entry
    return summary


def markdown(summary: dict[str, Any]) -> str:
    """The zoo table of docs/cpu-default.md."""
    lines = [
        f"k={summary['k']}, {summary['prompts']} prompts, max_tokens {summary['max_tokens']}, EOS honoured.",
        "",
        "| method | acceptance T=0 | per position T=0 | acceptance T=1 | per position T=1 "
        "| spec = reference output (T=0) | tok/s c=1 | tok/s c=8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in summary["methods"].items():
        runs = entry["runs"]

        def get(key: str, field_: str, runs: dict[str, Any] = runs) -> Any:
            return runs.get(key, {}).get(field_)

        match = entry.get("output_match_t0")
        tps1 = get("t0.0-c1", "output_tok_s")
        tps8 = get("t0.0-c8", "output_tok_s")
        lines.append(
            f"| {name} | {_fmt(get('t0.0-c1', 'acceptance_rate'))} "
            f"| {_fmt_list(get('t0.0-c1', 'per_position_acceptance'))} "
            f"| {_fmt(get('t1.0-c1', 'acceptance_rate'))} "
            f"| {_fmt_list(get('t1.0-c1', 'per_position_acceptance'))} "
            f"| {'—' if match is None else f'{match:.0%}'} "
            f"| {'—' if tps1 is None else f'{tps1:.0f}'} | {'—' if tps8 is None else f'{tps8:.0f}'} |"
        )
    for name, entry in summary["methods"].items():
        speed = entry.get("speed_vs_twin")
        if speed and speed["geometric_mean"] is not None:
            each = ", ".join("—" if r is None else f"{r - 1:+.1%}" for r in speed["ratios"])
            lines += ["", (f"{name} against {TWINS[name]}, greedy c=1 output tok/s in {speed['pairs']} interleaved "
                           f"pairs: {speed['geometric_mean'] - 1:+.1%} (geometric mean; pairs {each}).")]
    ngram = summary["methods"].get("ngram", {}).get("runs", {})
    if "t0.0-c1-prose" in ngram:
        lines += [
            "",
            f"ngram acceptance at T=0 by category: prose {_fmt(ngram['t0.0-c1-prose'].get('acceptance_rate'))}, "
            f"code editing {_fmt(ngram['t0.0-c1-code_editing'].get('acceptance_rate'))}.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_specdec.zoo.measure", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("reports/zoo-realism.json"), metavar="PATH",
                        help="where the JSON summary goes (default: %(default)s)")
    parser.add_argument("--log-dir", type=Path, default=Path("reports/zoo-logs"), metavar="DIR",
                        help="server logs (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=None, metavar="N",
                        help=f"use the first N built-in prompts (default: {ZOO_PROMPTS})")
    parser.add_argument("--methods", default=",".join(ZOO_METHODS), metavar="LIST",
                        help="comma-separated methods (default: %(default)s)")
    args = parser.parse_args(argv)
    summary = measure(args.log_dir, tuple(args.methods.split(",")), args.prompts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, sort_keys=True))
    print(markdown(summary))
    print(f"\nJSON: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
