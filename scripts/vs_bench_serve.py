"""Check the plugin's measurements against `vllm bench serve` (evidence that both use the same metric definitions).

    python -m scripts.vs_bench_serve ab        # real vLLM CPU server, zoo model
    python -m scripts.vs_bench_serve overhead  # client CPU per streamed token, fake server
    python -m scripts.vs_bench_serve overhead-inproc  # the request paths alone, in one process
    python -m scripts.vs_bench_serve load      # arrivals, goodput and synthetic lengths (vs_bench_load.py)

`ab` starts one zoo server (cpu profile, `--method`, k=3, prefix caching off so neither client gets
cache hits: `vllm bench serve` sends no cache_salt) and alternates the plugin's client and
`vllm bench serve` over the same prompts (the built-in dataset's user turns and max_tokens),
concurrency and temperature, in ABBA order so drift cancels.  For every bench run it also feeds the
`--save-detailed` file through the plugin's metric code (`metrics.bench_run_metrics`) and reports the
largest relative difference from bench serve's own figures (parity).  It reports, per pair, output
tok/s of each client, the 90% t-interval of the mean log ratio, and acceptance of each.

`overhead` runs each client against the simulated streaming server (tests/fakes, in its own
process) at concurrency 256 with N and 2N requests, and divides the difference in the client
process's CPU seconds by the difference in streamed tokens, so start-up and import cost cancel.  The
clients alternate in order from one repetition to the next, and the ratio of their slopes gets a 90%
t-interval over the repetitions (bench serve's start-up alone costs ~9 CPU s and varies by ~1 s, so N
must be large for its slope to be precise).

`vllm bench serve` needs pandas for its custom dataset (`pip install pandas`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts import vs_bench_load  # the load mode lives in its own module
from scripts.vllm_bench import bench_command, bench_prompts_file, run_bench, server_cpus

#: The checkout: the overhead mode's client child runs in it, so it imports this checkout's plugin as the tool does.
ROOT = Path(__file__).resolve().parents[1]


def t_interval(xs: list[float], level: float = 0.90) -> tuple[float, float, float]:
    from scipy import stats

    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def cmd_ab(args: argparse.Namespace) -> int:
    from pytest_specdec.measure.datasets import builtin
    from pytest_specdec.measure.metrics import bench_parity
    from pytest_specdec.measure.runner import one_run
    from pytest_specdec.measure.types import Sampling
    from pytest_specdec.measure.validity import ValidityRules
    from pytest_specdec.profiles import load_profile, server_spec
    from pytest_specdec.servers.http import served_model
    from pytest_specdec.servers.pool import Endpoint
    from pytest_specdec.servers.process import VllmServer
    from pytest_specdec.servers.quiet import wait_idle

    profile = load_profile("cpu")
    prompts = list(builtin().prompts[: args.prompts])
    spec = server_spec(profile, args.method, None if args.method == "none" else args.k)
    spec = dataclasses.replace(spec, args=(*spec.args, "--no-enable-prefix-caching"))
    out_dir = Path(args.out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    rules = ValidityRules(max_loop_lag_mean_ms=1e9)  # report lag; do not drop runs here
    pairs: list[dict[str, Any]] = []
    parities: list[dict[str, dict[str, float]]] = []
    env = {**os.environ, **dict(spec.env)}
    with tempfile.TemporaryDirectory() as tmp, VllmServer(spec, log_dir=out_dir / "vs-bench-logs",
                                                                  cpus=server_cpus(args.server_cpus)) as server:
        print(f"server ready in {server.startup_s:.0f} s: {' '.join(server.command)}", flush=True)
        model = served_model(server.base_url)
        assert server.proc is not None  # the with started it (VllmServer.__enter__)
        data = Path(tmp) / "prompts.jsonl"
        bench_prompts_file(prompts, data)
        endpoint = Endpoint(server.base_url, model, owned=True)
        sampling = Sampling(temperature=args.temperature)

        def ours(i: int) -> dict[str, Any]:
            rec = one_run(endpoint, "spec", i, prompts, sampling, concurrency=args.concurrency,
                          api_key=None, rules=rules)
            m = rec.metrics
            return {"output_tok_s": m.output_tok_s, "acceptance_rate": m.spec and m.spec.acceptance_rate,
                    "output_tokens": m.total_output_tokens, "loop_lag_mean_ms": m.loop_lag_mean_ms,
                    "invalid": list(rec.invalid)}

        def theirs(i: int) -> dict[str, Any]:
            name = f"bench-{i}.json"
            cmd = bench_command(server.base_url, model, str(profile.target), data, len(prompts),
                                args.concurrency, args.temperature, Path(tmp), name)
            res, _ = run_bench(cmd, env, Path(tmp) / name)
            parities.append(bench_parity(res))
            if i == 0 and args.keep_detailed:
                Path(args.keep_detailed).parent.mkdir(parents=True, exist_ok=True)
                Path(args.keep_detailed).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
            rate = res.get("spec_decode_acceptance_rate")
            return {"output_tok_s": res["output_throughput"], "output_tokens": res["total_output_tokens"],
                    "acceptance_rate": None if rate is None else rate / 100, "failed": res.get("failed", 0)}

        def bench_fn(i: int) -> dict[str, Any]:
            # bench serve's own request function, in this process, with bench serve's connector: the
            # requests bench serve sends (no continuous usage stats), without its process and start-up.
            import asyncio

            import aiohttp
            from vllm.benchmarks.lib.endpoint_request_func import (
                RequestFuncInput,
                async_request_openai_chat_completions,
            )

            async def go() -> tuple[int, float, int]:
                conn = aiohttp.TCPConnector(limit=args.concurrency, limit_per_host=args.concurrency,
                                            ttl_dns_cache=300, use_dns_cache=True, keepalive_timeout=60,
                                            enable_cleanup_closed=True, force_close=False, ssl=False)
                async with aiohttp.ClientSession(connector=conn, trust_env=True,
                                                 timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
                    sem = asyncio.Semaphore(args.concurrency)

                    async def one(p: Any) -> Any:
                        async with sem:
                            return await async_request_openai_chat_completions(RequestFuncInput(
                                prompt=p.messages[0]["content"], api_url=server.base_url + "/v1/chat/completions",
                                prompt_len=0, output_len=p.max_tokens, model=model,
                                extra_body={"temperature": args.temperature}), session)

                    t0 = time.perf_counter()
                    outs = await asyncio.gather(*(asyncio.create_task(one(p)) for p in prompts))
                    dt = time.perf_counter() - t0
                return sum(o.output_tokens or 0 for o in outs), dt, sum(not o.success for o in outs)

            tokens, dt, failed = asyncio.run(go())
            return {"output_tok_s": tokens / dt, "output_tokens": tokens, "acceptance_rate": None, "failed": failed}

        arms = {"plugin": ours, "bench": theirs, "bench-fn": bench_fn}
        chosen = [a.strip() for a in args.arms.split(",")]
        unknown = [a for a in chosen if a not in arms] or (["(need plugin and bench)"]
                                                          if not {"plugin", "bench"} <= set(chosen) else [])
        if unknown:
            raise SystemExit(f"--arms: unknown or missing {unknown}; choose from {sorted(arms)}")
        print("warm-up (every client, not counted)", flush=True)
        for a in chosen:
            arms[a](-1)
        parities.clear()
        for i in range(args.pairs):
            order = tuple(chosen[(j + i) % len(chosen)] for j in range(len(chosen)))
            if i % 2:
                order = order[::-1]
            pair: dict[str, Any] = {"order": order}
            for who in order:
                wait_idle({server.proc.pid})  # as the plugin does before every run: no leftover busy-wait
                pair[who] = arms[who](i)
                print(f"pair {i} {who}: {pair[who]['output_tok_s']:.1f} tok/s, "
                      f"acceptance {pair[who]['acceptance_rate']}", flush=True)
            pairs.append(pair)
    logs = [math.log(p["plugin"]["output_tok_s"] / p["bench"]["output_tok_s"]) for p in pairs]
    mean, lo, hi = t_interval(logs)
    extra: dict[str, Any] = {}
    if "bench-fn" in chosen:
        for other in ("plugin", "bench"):
            m2, l2, h2 = t_interval([math.log(p[other]["output_tok_s"] / p["bench-fn"]["output_tok_s"])
                                     for p in pairs])
            extra[f"tok_s_ratio_{other.replace('-', '_')}_over_bench_fn"] = {
                "mean": math.exp(m2), "ci90": [math.exp(l2), math.exp(h2)]}
            print(f"tok/s {other}/bench-fn: {math.exp(m2):.4f} (90% CI {math.exp(l2):.4f} – {math.exp(h2):.4f})")
    acc = [p["plugin"]["acceptance_rate"] - p["bench"]["acceptance_rate"] for p in pairs
           if p["plugin"]["acceptance_rate"] is not None and p["bench"]["acceptance_rate"] is not None]
    worst = max(((f, d["rel_diff"]) for par in parities for f, d in par.items()), key=lambda x: x[1])
    summary = {
        "method": args.method, "k": args.k, "concurrency": args.concurrency, "temperature": args.temperature,
        "prompts": len(prompts), "pairs": pairs,
        "tok_s_ratio_plugin_over_bench": {"mean": math.exp(mean), "ci90": [math.exp(lo), math.exp(hi)]},
        "acceptance_diff_points": {"mean": 100 * sum(acc) / len(acc) if acc else None,
                                   "max_abs": 100 * max(map(abs, acc)) if acc else None},
        "parity_max_rel_diff": {"field": worst[0], "rel_diff": worst[1]},
        "parity": parities,
        **extra,
    }
    Path(args.out).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"tok/s plugin/bench: {math.exp(mean):.4f} (90% CI {math.exp(lo):.4f} – {math.exp(hi):.4f}) over "
          f"{len(pairs)} pairs; acceptance difference mean {summary['acceptance_diff_points']['mean']:.3f} pt, "
          f"max |diff| {summary['acceptance_diff_points']['max_abs']:.3f} pt; parity: largest relative "
          f"difference {worst[1]:.2e} ({worst[0]}) over {len(parities)} bench runs -> {args.out}")
    return 0


#: The overhead mode's plugin client, run as `python -c` in the checkout (cwd=ROOT: `-c` puts the working directory
#: first on the import path): a process of its own, whose CPU seconds are the client's.
OVERHEAD_CHILD = r"""
import json, sys
from pytest_specdec.measure.types import Prompt, Sampling
from pytest_specdec.measure.client import run_load_sync
base_url, n, c, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompts = [Prompt(id=str(i), messages=[{"role": "user", "content": "hello %d" % i}], max_tokens=max_tokens)
           for i in range(n)]
res = run_load_sync(base_url, "fake-model", prompts, Sampling(temperature=0.0), concurrency=c, collect_metrics=False)
tokens = sum(s.output_tokens or 0 for s in res.samples if s.error is None)
print(json.dumps({"tokens": tokens, "failed": sum(s.error is not None for s in res.samples)}))
"""


def cmd_overhead(args: argparse.Namespace) -> int:
    """Per repetition, each client (order alternating) at N and 2N requests; slope = CPU per token."""
    from pytest_specdec.zoo import zoo_path
    from tests.fakes import FakeConfig, FakeServerProcess

    cfg = FakeConfig(output_tokens=args.max_tokens, k=3, acceptance=(0.0, 0.0, 0.0))
    points: list[dict[str, Any]] = []
    slopes: dict[str, list[float]] = {"plugin": [], "bench": []}
    with tempfile.TemporaryDirectory() as tmp, FakeServerProcess(cfg) as url:
        data = Path(tmp) / "prompts.jsonl"
        with data.open("w") as f:
            for i in range(2 * args.requests):
                f.write(json.dumps({"prompt": f"hello {i}", "output_tokens": args.max_tokens}) + "\n")

        def one(who: str, n: int) -> tuple[int, float]:
            if who == "plugin":
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                proc = subprocess.run([sys.executable, "-c", OVERHEAD_CHILD, url, str(n), str(args.concurrency),
                                       str(args.max_tokens)], cwd=ROOT, capture_output=True, text=True, check=True)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
                return json.loads(proc.stdout.strip().splitlines()[-1])["tokens"], cpu
            name = f"o-{n}.json"
            cmd = bench_command(url, "fake-model", str(zoo_path("target")), data, n, args.concurrency,
                                0.0, Path(tmp), name)
            res, cpu = run_bench(cmd, {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, Path(tmp) / name)
            return res["total_output_tokens"], cpu

        for rep in range(args.repeats):
            order = ("plugin", "bench") if rep % 2 == 0 else ("bench", "plugin")
            for who in order:
                got = {}
                for n in (args.requests, 2 * args.requests):
                    tokens, cpu = one(who, n)
                    got[n] = (tokens, cpu)
                    points.append({"rep": rep, "client": who, "requests": n, "tokens": tokens, "cpu_s": cpu})
                (t1, c1), (t2, c2) = got[args.requests], got[2 * args.requests]
                slopes[who].append(1e6 * (c2 - c1) / (t2 - t1))
                print(f"rep {rep} {who}: {c1:.2f} / {c2:.2f} CPU s for {t1} / {t2} tokens -> "
                      f"{slopes[who][-1]:.1f} µs per token", flush=True)
    logs = [math.log(a / b) for a, b in zip(slopes["plugin"], slopes["bench"], strict=True)]
    mean, lo, hi = t_interval(logs) if len(logs) > 1 else (logs[0], float("nan"), float("nan"))
    med = {who: sorted(v)[len(v) // 2] for who, v in slopes.items()}
    summary = {"concurrency": args.concurrency, "max_tokens": args.max_tokens, "requests": args.requests,
               "repeats": args.repeats, "fake_server": dataclasses.asdict(cfg), "points": points,
               "cpu_us_per_token": slopes,
               "ratio_plugin_over_bench": {"mean": math.exp(mean), "ci90": [math.exp(lo), math.exp(hi)]}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"CPU per streamed token at c={args.concurrency} (median of {args.repeats}): plugin "
          f"{med['plugin']:.1f} µs, vllm bench serve {med['bench']:.1f} µs; plugin/bench {math.exp(mean):.3f} "
          f"(90% CI {math.exp(lo):.3f}-{math.exp(hi):.3f}) -> {args.out}")
    return 0


def cmd_overhead_inproc(args: argparse.Namespace) -> int:
    """The request paths alone, in one process: the plugin's `run_load` and bench serve's own request
    function (`async_request_openai_chat_completions`, with bench serve's connector settings) alternate
    against the same fake server; CPU seconds of each pass / its streamed tokens.  No start-up or
    dataset handling, so the per-token cost is not diluted by bench serve's ~9 s of imports."""
    import asyncio
    import statistics

    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

    from pytest_specdec.measure.client import run_load_sync
    from pytest_specdec.measure.types import Prompt, Sampling
    from tests.fakes import FakeConfig, FakeServerProcess

    n, c, mt = args.requests, args.concurrency, args.max_tokens

    async def bench(url: str) -> int:
        conn = aiohttp.TCPConnector(limit=c, limit_per_host=c, ttl_dns_cache=300, use_dns_cache=True,
                                    keepalive_timeout=60, enable_cleanup_closed=True, force_close=False, ssl=False)
        async with aiohttp.ClientSession(connector=conn, trust_env=True,
                                         timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
            sem = asyncio.Semaphore(c)

            async def one(i: int) -> Any:
                async with sem:
                    return await async_request_openai_chat_completions(RequestFuncInput(
                        prompt=f"hello {i}", api_url=url + "/v1/chat/completions", prompt_len=3, output_len=mt,
                        model="fake-model", extra_body={"temperature": 0.0}), session)

            outs = await asyncio.gather(*(asyncio.create_task(one(i)) for i in range(n)))
        return sum(o.output_tokens or 0 for o in outs)

    def plugin(url: str) -> int:
        prompts = [Prompt(id=str(i), messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=mt)
                   for i in range(n)]
        res = run_load_sync(url, "fake-model", prompts, Sampling(temperature=0.0), concurrency=c,
                            collect_metrics=False)
        return sum(s.output_tokens for s in res.samples)

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    cfg = FakeConfig(output_tokens=mt, k=3, acceptance=(0.0, 0.0, 0.0))
    us: dict[str, list[float]] = {"plugin": [], "bench": []}
    with FakeServerProcess(cfg) as url:
        plugin(url), asyncio.run(bench(url))  # warm both paths once
        for rep in range(args.repeats):
            for who in (("plugin", "bench") if rep % 2 == 0 else ("bench", "plugin")):
                t0 = cpu()
                tokens = plugin(url) if who == "plugin" else asyncio.run(bench(url))
                us[who].append(1e6 * (cpu() - t0) / tokens)
                print(f"rep {rep} {who}: {us[who][-1]:.1f} µs per token", flush=True)
    logs = [math.log(a / b) for a, b in zip(us["plugin"], us["bench"], strict=True)]
    mean, lo, hi = t_interval(logs)
    summary = {"concurrency": c, "max_tokens": mt, "requests": n, "repeats": args.repeats, "cpu_us_per_token": us,
               "ratio_plugin_over_bench": {"mean": math.exp(mean), "ci90": [math.exp(lo), math.exp(hi)]}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"request path CPU per token at c={c} (median of {args.repeats}): plugin "
          f"{statistics.median(us['plugin']):.1f} µs, bench serve's request function "
          f"{statistics.median(us['bench']):.1f} µs; plugin/bench {math.exp(mean):.3f} "
          f"(90% CI {math.exp(lo):.3f}-{math.exp(hi):.3f}) -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ab = sub.add_parser("ab", help="interleaved A/B and parity on a real vLLM CPU server")
    ab.add_argument("--method", default="eagle3", help="cpu-profile method (default: %(default)s)")
    ab.add_argument("--k", type=int, default=3, help="num_speculative_tokens (default: %(default)s)")
    ab.add_argument("--concurrency", type=int, default=4, help="(default: %(default)s)")
    ab.add_argument("--temperature", type=float, default=0.0, help="(default: %(default)s)")
    ab.add_argument("--prompts", type=int, default=32, help="first N built-in prompts (default: %(default)s)")
    ab.add_argument("--pairs", type=int, default=6, help="A/B pairs after warm-up (default: %(default)s)")
    ab.add_argument("--server-cpus", default=None, metavar="CPUS",
                    help="start the server's processes on these CPUs, e.g. 1 (default: not pinned)")
    ab.add_argument("--arms", default="plugin,bench", help="clients to alternate, comma-separated, from plugin, "
                    "bench, bench-fn (bench serve's request function in this process) (default: %(default)s)")
    ab.add_argument("--out", default="reports/vs-bench-serve-ab.json", help="(default: %(default)s)")
    ab.add_argument("--keep-detailed", default=None, metavar="PATH",
                    help="also save the first measured bench serve detailed result here")
    ov = sub.add_parser("overhead", help="client CPU per streamed token against the fake server")
    ov.add_argument("--concurrency", type=int, default=256, help="(default: %(default)s)")
    ov.add_argument("--requests", type=int, default=4096, help="N; runs use N and 2N (default: %(default)s)")
    ov.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default: %(default)s)")
    ov.add_argument("--repeats", type=int, default=5, help="repetitions, each a pair of slopes (default: %(default)s)")
    ov.add_argument("--out", default="reports/vs-bench-serve-overhead.json", help="(default: %(default)s)")
    oi = sub.add_parser("overhead-inproc", help="request paths only, in one process, against the fake server")
    oi.add_argument("--concurrency", type=int, default=256, help="(default: %(default)s)")
    oi.add_argument("--requests", type=int, default=1024, help="requests per pass (default: %(default)s)")
    oi.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default: %(default)s)")
    oi.add_argument("--repeats", type=int, default=8, help="alternating pairs of passes (default: %(default)s)")
    oi.add_argument("--out", default="reports/vs-bench-serve-overhead-inproc.json", help="(default: %(default)s)")
    vs_bench_load.add_arguments(sub.add_parser("load", help="burstiness, goodput and random-dataset lengths on a "
                                               "real vLLM CPU server (scripts/vs_bench_load.py)"))
    args = ap.parse_args(argv)
    return {"ab": cmd_ab, "load": vs_bench_load.cmd_load, "overhead": cmd_overhead,
            "overhead-inproc": cmd_overhead_inproc}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
