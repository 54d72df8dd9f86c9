"""Why the cpu profile's reference stream arrived in one burst, and whether lowering the servers' priority
cures it (docs/measurement.md, "Coalesced streams").

    .venv/bin/python scripts/stream_bursts.py [--method eagle3] [--blocks 6] [--pairs 2] [--concurrency 1]

Starts the cpu profile's reference (`none`) and spec (k=3) servers side by side with the profile's
settings but at the client's priority, then runs ABBA blocks of interleaved pairs, as a test does (the
pool's idle wait before every run): in one condition the servers' sessions keep the client's priority,
in the other their autogroup nice value is 19 (what `[placement] server_nice` does; any user may raise
a nice value, so the switch needs no privilege). 8 built-in prompts of at most 64 tokens.

Per run it prints how the tokens arrived (`metrics.chunking`: events, client reads, the largest event,
the share of tokens that came more than one step's worth at once), how many requests had their first
token after half their E2E (a burst), the client's scheduler run delay (time it was runnable but not
running, from /proc/self/task/*/schedstat) and its event-loop lag; per condition and arm, the totals.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
from pathlib import Path


from pytest_specdec.measure.datasets import builtin  # noqa: E402
from pytest_specdec.measure.types import Sampling  # noqa: E402
from pytest_specdec.measure.client import run_load_sync  # noqa: E402
from pytest_specdec.servers.http import served_model  # noqa: E402
from pytest_specdec.measure.metrics import chunking  # noqa: E402
from pytest_specdec.servers.pool import ServerPool  # noqa: E402
from pytest_specdec.profiles import load_profile, server_spec  # noqa: E402


def run_delay_ms() -> float:
    """This process's scheduler run delay so far, summed over its threads (ms)."""
    total = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                total += int(f.read().split()[1])
        except OSError:
            pass
    return total / 1e6


def set_autogroup(pid: int, nice: int) -> None:
    with open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(nice))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="eagle3")
    ap.add_argument("--blocks", type=int, default=6, help="ABBA blocks (default: %(default)s)")
    ap.add_argument("--pairs", type=int, default=2, help="interleaved pairs per condition and block")
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args(argv)
    if not Path("/proc/self/autogroup").exists():
        raise SystemExit("this kernel has no autogroups (/proc/self/autogroup): nothing to switch")
    profile = load_profile("cpu")
    specs = [server_spec(profile, "none", None), server_spec(profile, args.method, 3)]
    prompts = [dataclasses.replace(p, max_tokens=min(p.max_tokens, 64)) for p in builtin().prompts[:8]]
    pool = ServerPool(Path(tempfile.mkdtemp()), max_alive=2, startup_timeout_s=600, progress=print)
    rows: list[dict] = []
    try:
        servers = [pool.get(s) for s in specs]
        models = [served_model(s.base_url) for s in servers]
        for s, m in zip(servers, models):  # warm-up: first shapes are slow on a fresh server
            run_load_sync(s.base_url, m, prompts, Sampling(temperature=0.0), concurrency=args.concurrency)
        for block in range(args.blocks):
            order = (0, 19) if block % 2 == 0 else (19, 0)
            for nice in order:
                for s in servers:
                    assert s.proc is not None
                    set_autogroup(s.proc.pid, nice)
                for _ in range(args.pairs):
                    for arm, s, m, limit in (("reference", servers[0], models[0], 1),
                                             ("spec", servers[1], models[1], 4)):
                        pool.wait_quiet(3.0)
                        d0 = run_delay_ms()
                        res = run_load_sync(s.base_url, m, prompts, Sampling(temperature=0.0),
                                            concurrency=args.concurrency)
                        delay = run_delay_ms() - d0
                        ok = [x for x in res.samples if x.ok]
                        c = chunking(ok, limit)
                        bursts = sum(1 for x in ok if x.ttft_s and x.e2e_s and x.ttft_s > 0.5 * x.e2e_s)
                        ttfts = sorted(x.ttft_s * 1000 for x in ok if x.ttft_s)
                        row = dict(nice=nice, arm=arm, tok_s=c.tokens / res.duration_s, events=sum(c.events.values()),
                                   reads=sum(c.reads.values()), max_event=c.max_event_tokens,
                                   share=c.over_limit_share, bursts=bursts, ttft_max=ttfts[-1],
                                   run_delay=delay, lag_max=res.loop_lag_max_s * 1000,
                                   lag_mean=res.loop_lag_mean_s * 1000)
                        rows.append(row)
                        print(f"block {block} nice {nice:2d} {arm:9s} {row['tok_s']:6.0f} tok/s  events {row['events']:4d} "
                              f"reads {row['reads']:4d}  max tokens/event {row['max_event']}  over-limit "
                              f"{row['share']:5.1%}  bursts {bursts}  TTFT max {row['ttft_max']:5.0f} ms  client "
                              f"run delay {delay:5.0f} ms  loop lag max {row['lag_max']:4.0f} ms", flush=True)
    finally:
        pool.stop_all()
    print("\nper condition and arm (runs; runs with a read over the step limit; runs over 5 % of tokens; "
          "requests in a burst; max tokens in one event; median client run delay; median tok/s)")
    for nice in (0, 19):
        for arm in ("reference", "spec"):
            r = [x for x in rows if x["nice"] == nice and x["arm"] == arm]
            print(f"  server nice {nice:2d} {arm:9s} runs {len(r):2d}  with late reads {sum(x['reads'] < x['events'] for x in r):2d}"
                  f"  over 5 % {sum(x['share'] > 0.05 for x in r):2d}  burst requests {sum(x['bursts'] for x in r):3d}"
                  f"  max tokens/event {max(x['max_event'] for x in r)}"
                  f"  run delay {statistics.median(x['run_delay'] for x in r):5.0f} ms"
                  f"  {statistics.median(x['tok_s'] for x in r):6.1f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
