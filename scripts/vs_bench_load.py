"""The plugin's load shaping against `vllm bench serve` on one real vLLM CPU server (vs_bench_serve.py's `load` mode).

    python -m scripts.vs_bench_serve load [--pairs 3] [--server-cpus 1]
    python -m scripts.vs_bench_load [same options]

One zoo server (cpu profile, `--method`, k, prefix caching off as in `ab`) serves both clients. Per workload,
the plugin's client (`run_load_sync`: its gamma arrivals; `synthetic`: its random-dataset prompts with the
target's tokenizer; `compute_run_metrics`: its goodput) and `vllm bench serve` (`--dataset-name random`,
`--burstiness`, `--goodput`, `--ignore-eos`, `--seed 0`) alternate in ABBA order at the same request rate,
concurrency cap, lengths and SLOs. The workloads: burstiness 0.5, 1 and 4 at `--rate` (fixed lengths), and
`--range-ratio` lengths at burstiness 1; every run counts goodput against `--goodput`.

Per workload it prints each client's mean request throughput, output tok/s and goodput with the relative
difference (plugin / bench - 1), and whether the token counts agree exactly: every request's input tokens as
the server counted them (the plugin's usage `prompt_tokens`) against bench's `input_lens`, and its output
tokens against bench's `output_lens` (`--save-detailed`), request by request in prompt order.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from scripts.vllm_bench import run_bench, server_cpus  # bench serve's runner and the server pinning, as `ab`'s

#: The figures compared, as (the plugin's RunMetrics field, bench serve's result key).
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("request_s", "request_throughput", "req/s"),
    ("output_tok_s", "output_throughput", "tok/s"),
    ("goodput_req_s", "request_goodput", "good req/s"),
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One compared load: its arrivals' shape and its prompts' lengths (bench serve's flags of the same name)."""

    name: str
    burstiness: float
    range_ratio: float


def parse_slos(text: str) -> dict[str, float]:
    """`ttft:500 tpot:50` (bench serve's `--goodput` syntax) → {"ttft": 500.0, "tpot": 50.0}; a bad pair is an
    error naming it, as the marker's goodput keys are the only SLOs either side knows."""
    from pytest_specdec.markers import GOODPUT_KEYS

    slos: dict[str, float] = {}
    for pair in text.split():
        name, _, ms = pair.partition(":")
        try:
            value = float(ms)
        except ValueError:
            value = -1.0
        if name not in GOODPUT_KEYS or value <= 0:
            raise SystemExit(f"--goodput {pair!r}: give NAME:MS pairs with NAME in {', '.join(GOODPUT_KEYS)} "
                             "and MS > 0, e.g. 'ttft:500 tpot:50'")
        slos[name] = value
    if not slos:
        raise SystemExit("--goodput: give at least one SLO, e.g. 'ttft:500 tpot:50'")
    return slos


def require_plugin_features() -> None:
    """The plugin's side must be the plugin's own code: say which piece this checkout lacks rather than
    measure something else."""
    from pytest_specdec.measure import client, metrics

    missing = []
    if "burstiness" not in inspect.signature(client.run_load_sync).parameters:
        missing.append("run_load_sync(burstiness=...) (gamma arrivals)")
    if "goodput_slos_ms" not in inspect.signature(metrics.compute_run_metrics).parameters:
        missing.append("compute_run_metrics(..., goodput_slos_ms) (goodput)")
    try:
        from pytest_specdec.measure.datasets import synthetic  # noqa: F401
    except ImportError:
        missing.append("pytest_specdec.measure.datasets.synthetic (synthetic prompts)")
    if missing:
        raise SystemExit("load mode needs the plugin's " + "; ".join(missing) + ", not in this checkout")


def bench_command(base_url: str, model: str, tokenizer: str, args: argparse.Namespace, w: Workload,
                  slos: dict[str, float], result_dir: Path, name: str) -> list[str]:
    """bench serve on the completions endpoint with the random dataset, the plugin's settings flag for flag."""
    return [
        sys.executable, "-m", "pytest_specdec.vllm.cli", "bench", "serve",
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--random-range-ratio", str(w.range_ratio),
        "--ignore-eos", "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
        "--request-rate", str(args.rate), "--burstiness", str(w.burstiness), "--temperature", "0",
        "--seed", "0", "--num-warmups", "0", "--goodput", *(f"{k}:{v:g}" for k, v in slos.items()),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--save-detailed",
        "--result-dir", str(result_dir), "--result-filename", name, "--ready-check-timeout-sec", "0",
    ]


def relative(plugin: float | None, bench: float | None) -> float | None:
    """plugin / bench - 1; None where either is missing or bench's is 0."""
    return None if plugin is None or not bench else plugin / bench - 1


def compare(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One workload's means per client, their relative differences, and the token counts' exact agreement."""
    out: dict[str, Any] = {}
    for field, _, unit in FIGURES:
        means = {who: statistics.fmean(r[field] for r in rs) if all(r[field] is not None for r in rs) else None
                 for who, rs in runs.items()}
        out[field] = {"unit": unit, **means, "rel_diff": relative(means["plugin"], means["bench"])}
    mismatches = [
        {"pair": i, "what": what, "plugin": p[what], "bench": b[what]}
        for i, (p, b) in enumerate(zip(runs["plugin"], runs["bench"], strict=True))
        for what in ("input_tokens", "output_tokens") if p[what] != b[what]
    ]
    out["tokens_exact"] = not mismatches
    out["token_mismatches"] = mismatches
    out["input_tokens_total"] = {who: sum(rs[0]["input_tokens"]) for who, rs in runs.items()}
    out["output_tokens_total"] = {who: sum(rs[0]["output_tokens"]) for who, rs in runs.items()}
    return out


def cmd_load(args: argparse.Namespace) -> int:
    """Start the server, warm both clients, then per workload alternate them over `--pairs` ABBA pairs."""
    slos = parse_slos(args.goodput)
    require_plugin_features()
    from pytest_specdec.measure.client import run_load_sync
    from pytest_specdec.measure.datasets.synthetic import synthetic
    from pytest_specdec.measure.metrics import compute_run_metrics, counters_delta
    from pytest_specdec.measure.types import Sampling
    from pytest_specdec.profiles import load_profile, server_spec
    from pytest_specdec.servers.http import served_model
    from pytest_specdec.servers.process import VllmServer
    from pytest_specdec.servers.quiet import wait_idle

    workloads = [Workload(f"burstiness {b:g}", b, 0.0) for b in args.burstiness]
    if args.lengths:
        workloads.append(Workload(f"range_ratio {args.range_ratio:g}", 1.0, args.range_ratio))
    profile = load_profile("cpu")
    spec = server_spec(profile, args.method, None if args.method == "none" else args.k)
    spec = dataclasses.replace(spec, args=(*spec.args, "--no-enable-prefix-caching"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **dict(spec.env)}
    sampling = Sampling(temperature=0.0, ignore_eos=True)  # bench's --ignore-eos, --temperature 0
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, VllmServer(spec, log_dir=out.parent / "vs-bench-logs",
                                                          cpus=server_cpus(args.server_cpus)) as server:
        print(f"server ready in {server.startup_s:.0f} s: {' '.join(server.command)}", flush=True)
        model = served_model(server.base_url)
        assert server.proc is not None  # the with started it (VllmServer.__enter__)

        def plugin(w: Workload) -> dict[str, Any]:
            prompts = list(synthetic(str(profile.target), args.num_prompts, args.input_len, args.output_len,
                                     w.range_ratio).prompts)
            load = run_load_sync(server.base_url, model, prompts, sampling, concurrency=args.concurrency,
                                 api="completions", rate=args.rate, seed=0, burstiness=w.burstiness,
                                 cache_salt=uuid.uuid4().hex)
            m = compute_run_metrics(load, counters_delta(load), slos)
            by_id = {s.prompt_id: s for s in load.samples}
            ordered = [by_id[p.id] for p in prompts]  # bench's lists are in its dataset's order, as ours
            return {"request_s": m.request_s, "output_tok_s": m.output_tok_s, "goodput_req_s": m.goodput_req_s,
                    "input_tokens": [s.prompt_tokens for s in ordered],
                    "output_tokens": [s.output_tokens for s in ordered], "failed": m.n_failed}

        def bench(w: Workload, tag: str) -> dict[str, Any]:
            name = f"bench-{tag}.json"
            res, _ = run_bench(bench_command(server.base_url, model, str(profile.target), args, w, slos,
                                             Path(tmp), name), env, Path(tmp) / name)
            return {"request_s": res["request_throughput"], "output_tok_s": res["output_throughput"],
                    "goodput_req_s": res.get("request_goodput"), "input_tokens": list(res["input_lens"]),
                    "output_tokens": list(res["output_lens"]), "failed": res.get("failed", 0),
                    # where the SLOs sit: bench's medians, to choose SLOs that some requests miss
                    "median_ttft_ms": res.get("median_ttft_ms"), "median_tpot_ms": res.get("median_tpot_ms")}

        print("warm-up (each client once, not counted)", flush=True)
        plugin(workloads[0]), bench(workloads[0], "warmup")
        for wi, w in enumerate(workloads):
            runs: dict[str, list[dict[str, Any]]] = {"plugin": [], "bench": []}
            for i in range(args.pairs):
                for who in (("plugin", "bench") if i % 2 == 0 else ("bench", "plugin")):
                    wait_idle({server.proc.pid})  # as the plugin does before every run
                    r = plugin(w) if who == "plugin" else bench(w, f"{wi}-{i}")
                    runs[who].append(r)
                    medians = (f", median TTFT {r['median_ttft_ms']:.0f} ms, TPOT {r['median_tpot_ms']:.1f} ms"
                               if who == "bench" else "")
                    print(f"{w.name} pair {i} {who}: {r['request_s']:.3f} req/s, {r['output_tok_s']:.1f} tok/s, "
                          f"goodput {r['goodput_req_s']:.3f}, failed {r['failed']}{medians}", flush=True)
            results[w.name] = {"workload": dataclasses.asdict(w), "runs": runs, **compare(runs)}
    summary = {"method": args.method, "k": args.k, "rate": args.rate, "concurrency": args.concurrency,
               "num_prompts": args.num_prompts, "input_len": args.input_len, "output_len": args.output_len,
               "goodput_slos_ms": slos, "pairs": args.pairs, "load_average": os.getloadavg(),
               "workloads": results}
    out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    for name, r in results.items():
        diffs = ", ".join(f"{f} {r[f]['plugin']:.3f} v {r[f]['bench']:.3f} ({100 * r[f]['rel_diff']:+.2f} %)"
                          if r[f]["rel_diff"] is not None else f"{f} {r[f]['plugin']} v {r[f]['bench']}"
                          for f, _, _ in FIGURES)
        print(f"{name}: plugin v bench {diffs}; tokens exact: {r['tokens_exact']} (input "
              f"{r['input_tokens_total']['plugin']} v {r['input_tokens_total']['bench']}, output "
              f"{r['output_tokens_total']['plugin']} v {r['output_tokens_total']['bench']})")
    print(f"-> {out}")
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The load mode's options (shared by vs_bench_serve.py's `load` subcommand and this script)."""
    ap.add_argument("--method", default="eagle3", help="cpu-profile method (default: %(default)s)")
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens (default: %(default)s)")
    ap.add_argument("--rate", type=float, default=2.0, help="request rate, req/s (default: %(default)s)")
    ap.add_argument("--burstiness", type=float, nargs="+", default=[0.5, 1.0, 4.0],
                    help="gamma shapes of the arrivals, one workload each (default: %(default)s)")
    ap.add_argument("--goodput", default="ttft:1000 tpot:100",
                    help="SLOs in bench serve's syntax, counted in every run (default: %(default)s)")
    ap.add_argument("--num-prompts", type=int, default=16, help="(default: %(default)s)")
    ap.add_argument("--concurrency", type=int, default=16, help="in-flight cap of both clients (default: %(default)s)")
    ap.add_argument("--input-len", type=int, default=64, help="(default: %(default)s)")
    ap.add_argument("--output-len", type=int, default=32, help="(default: %(default)s)")
    ap.add_argument("--range-ratio", type=float, default=0.5,
                    help="the lengths workload's range ratio (default: %(default)s)")
    ap.add_argument("--lengths", action=argparse.BooleanOptionalAction, default=True,
                    help="run the range-ratio lengths workload too (default: %(default)s)")
    ap.add_argument("--pairs", type=int, default=3, help="ABBA pairs per workload after warm-up (default: %(default)s)")
    ap.add_argument("--server-cpus", default=None, metavar="CPUS",
                    help="start the server's processes on these CPUs, e.g. 1 (default: not pinned)")
    ap.add_argument("--out", default="reports/vs-bench-serve-load.json", help="(default: %(default)s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return cmd_load(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
