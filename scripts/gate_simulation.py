"""Simulated false alarms and power of the speed gate, decided by the gate's own pipeline.

    .venv/bin/python -m scripts.gate_simulation [--suites 1000] [--power-suites 400] [--seed 7] [--disturbed-only]
    .venv/bin/python -m scripts.gate_simulation --new-host [--suites 400] [--power-suites 200]

One simulated suite is what `pytest suites/` runs against stored baselines: 19 tests, each with the
gated family (speedup, P95 E2E ratio spec/reference, acceptance rate). Every stored file holds J nights
of the profile's `runs` interleaved pairs; tonight takes as many, and each further look (2 more pairs,
up to `max_runs`) only when ``next_look_useful`` says it could settle a gated verdict (alpha split over
the planned looks). The night
variances are pooled over the suite's 19 simulated files (``estimate_night_variance``, never tonight,
raised to the profile's ``min_night_sd``),
and every test goes through the gate's pipeline (`gate/pipeline.py`: the looks, the machine factor, BH over
the session's family), as in the plugin.

Noise: each metric's run-to-run and night-to-night sd, and the share of the night effect common to all
tests, are measured on the stored baselines (printed first). Every night the machine also runs at a
speed drawn from 0.75x to 1.25x for both arms; it multiplies both arms' tok/s and E2E times, so it
divides out of the per-pair ratios, as on the real machine where only the measured residual is left.
The GPU-like rows use a 3 % run CV and a 1 % night sd instead, with the h100 profile's thresholds and runs.
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
import time
import tomllib
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from pytest_specdec.gate.baselines import hardware_key, load
from pytest_specdec.gate.check import Judgement, Plan
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.pipeline import Pipeline, Stored, sequential
from pytest_specdec.gate.registry import GATED
from pytest_specdec.gate.scale import kind_of
from pytest_specdec.gate.sequential import planned_looks
from pytest_specdec.gate.stats import Thresholds
from pytest_specdec.gate.thresholds import build_thresholds
from pytest_specdec.gate.variance import NightPrior, night_prior_from
from pytest_specdec.measure.validity import disturbed

ROOT = Path(__file__).resolve().parents[1]

TESTS = 19
STORED_RUNS = 3  # pairs per stored night in baselines/cpu
ALPHA = 0.05
# True levels (the simulation's truth; only the ratios to them matter).
LEVEL = {"speedup": 1.0, "e2e_p95_ratio": 1.0, "acceptance_rate": 0.6}
REF_TOK_S, REF_E2E_MS = 200.0, 400.0
RULE = 0.3  # the disturbed-run rule's max_run_slowdown, the plugin's default (measure/validity.py)


@dataclass(frozen=True)
class Noise:
    """sd on the comparison scale (log for ratios, fraction for acceptance) per gated metric."""

    run: dict[str, float]
    night: dict[str, float]  # a test's own night effect
    shared: dict[str, float]  # the part of the night effect every test shares


def measured_noise(directory: Path) -> Noise:
    """Run, night and shared-night sd of the gated metrics, pooled over one machine's stored baselines."""
    files = [d for f in sorted(glob.glob(str(directory / "**" / "*.json"), recursive=True))
             if (d := load(Path(f), "--update-baselines")) is not None]
    if not files:
        raise SystemExit(f"no stored baselines under {directory}")
    machines = sorted({hardware_key(d["comparability"]) for d in files})
    if len(machines) > 1:  # one machine's noise: another's nights are not the same machine's nights
        raise SystemExit(f"{directory} holds the nights of {len(machines)} machines ({', '.join(machines)}); "
                         "pass one with --baselines")
    nv = dict(Stored(tuple(files)).variances)  # no floor: the noise as measured
    # Acceptance repeats exactly run to run at temperature 0 (the exact rule, no p-value); every simulated
    # test gets the noise of the stored tests where it does vary, which is the harder case for the gate.
    varying = [f for f in files if any(len(set(_values(e, "acceptance_rate"))) > 1 for e in f["sessions"])]
    nv["acceptance_rate"] = Stored(tuple(varying)).variances["acceptance_rate"]
    run = {m: math.sqrt(nv[m].within) for m in GATED}
    night: dict[str, float] = {}
    shared: dict[str, float] = {}
    for m in GATED:
        # The night effect every test shares: the spread of each night's mean deviation over the files,
        # less what the tests' own night and run noise leave in such a mean.
        scale = math.log if kind_of(m) != "acceptance" else float
        devs: dict[str, list[float]] = {}
        for data in varying if m == "acceptance_rate" else files:
            means = {e["started"]: sum(map(scale, v)) / len(v) for e in data["sessions"] if (v := _values(e, m))}
            if len(means) > 1:
                mu = sum(means.values()) / len(means)
                for k, x in means.items():
                    devs.setdefault(k, []).append(x - mu)
        spread = float(np.var([np.mean(v) for v in devs.values()], ddof=1))
        own = (nv[m].between + nv[m].within / STORED_RUNS) / float(np.mean([len(v) for v in devs.values()]))
        shared[m] = math.sqrt(max(0.0, spread - own))
        night[m] = math.sqrt(max(0.0, nv[m].between - shared[m] ** 2))  # the pooled between holds both
    return Noise(run, night, shared)


def _values(entry: dict, metric: str) -> list[float]:
    from pytest_specdec.gate.baselines import metric_values

    return metric_values(entry).get(metric, [])


def gpu_noise() -> Noise:
    """GPU-like: 3 % run CV and 1 % night sd on the ratios, 0.5 / 0.3 points on acceptance; no shared part."""
    return Noise(run={"speedup": 0.03, "e2e_p95_ratio": 0.03, "acceptance_rate": 0.005},
                 night={"speedup": 0.01, "e2e_p95_ratio": 0.01, "acceptance_rate": 0.003},
                 shared={"speedup": 0.0, "e2e_p95_ratio": 0.0, "acceptance_rate": 0.0})


def profile_gate(name: str) -> tuple[Thresholds, list[int], float]:
    """A profile's thresholds, planned looks (runs per arm at each look) and night sd floor (%)."""
    raw = tomllib.loads((ROOT / "pytest_specdec" / "profiles" / f"{name}.toml").read_text())
    runs, v = raw["matrix"]["runs"], raw["verdicts"]
    return (build_thresholds(v["thresholds"]), planned_looks(runs, 2, v.get("max_runs", runs)),
            float(v.get("min_night_sd", 0.0)))


def _night(rng: np.random.Generator, noise: Noise, shared: dict[str, float], runs: int, started: str,
           slowdown: float = 1.0, extra: float = 0.0, disturb: float = 0.0) -> dict:
    """One night of one test as a stored session: both arms' runs (tok/s, P95 E2E, acceptance) with the
    machine's speed that night applied to both arms, so that it divides out of the per-pair ratios.
    ``disturb``: each run's chance of being disturbed (something else takes the cores: a third of the speed,
    three times the E2E). The disturbed-run rule is applied by ``_ruled``."""
    machine = rng.uniform(0.75, 1.25)
    effect = {m: rng.normal(0.0, noise.night[m]) + shared[m] for m in GATED}
    for m in ("speedup", "e2e_p95_ratio"):
        effect[m] += rng.normal(0.0, extra)
    # half the pair's run variance on each arm: the ratio's run sd is noise.run[m]
    e = {(m, arm): rng.normal(0.0, noise.run[m] / math.sqrt(2), runs) for m in GATED for arm in ("ref", "spec")}
    ref_tok = REF_TOK_S * machine * np.exp(e["speedup", "ref"])
    spec_tok = REF_TOK_S * machine * LEVEL["speedup"] * slowdown * np.exp(effect["speedup"] + e["speedup", "spec"])
    ref_e2e = REF_E2E_MS / machine * np.exp(e["e2e_p95_ratio", "ref"])  # a slower spec arm takes longer
    spec_e2e = (REF_E2E_MS / machine * LEVEL["e2e_p95_ratio"] / slowdown
                * np.exp(effect["e2e_p95_ratio"] + e["e2e_p95_ratio", "spec"]))
    acc = LEVEL["acceptance_rate"] + effect["acceptance_rate"] + e["acceptance_rate", "spec"] * math.sqrt(2)
    if disturb:
        for tok, e2e in ((ref_tok, ref_e2e), (spec_tok, spec_e2e)):
            hit = rng.random(runs) < disturb
            tok[hit] /= 3.0
            e2e[hit] *= 3.0
    ref = [{"index": i, "valid": True, "output_tok_s": float(ref_tok[i]), "hd_p95_ms": {"e2e": float(ref_e2e[i])}}
           for i in range(runs)]
    spec = [{"index": i, "valid": True, "output_tok_s": float(spec_tok[i]), "acceptance_rate": float(acc[i]),
             "hd_p95_ms": {"e2e": float(spec_e2e[i])}} for i in range(runs)]
    return {"started": started, "runs": {"reference": ref, "spec": spec},
            "speedup_per_pair": [float(x) for x in spec_tok / ref_tok]}


def _ruled(entry: dict, n: int, rule: float) -> dict:
    """The night's first ``n`` pairs with the disturbed-run rule applied over them, as the runner applies it
    after each look (``rule``: ``max_run_slowdown``; 0 leaves every run valid)."""
    runs = {arm: [dict(r) for r in entry["runs"][arm][:n]] for arm in ("reference", "spec")}
    for arm_runs in runs.values():
        for i in disturbed([r["output_tok_s"] for r in arm_runs], rule):
            arm_runs[i]["valid"] = False
    pairs = [x if runs["reference"][i]["valid"] and runs["spec"][i]["valid"] else None
             for i, x in enumerate(entry["speedup_per_pair"][:n])]
    return {**entry, "runs": runs, "speedup_per_pair": pairs}


def _first(entry: dict, n: int, rule: float = 0.0) -> Night:
    """Tonight's first ``n`` pairs: what the session has judged at the look that has them."""
    return Night.from_entry(_ruled(entry, n, rule))


def suite(rng: np.random.Generator, noise: Noise, thresholds: Thresholds, nights: int, looks: list[int],
          floor: float, slowdown: float = 1.0, extra: float = 0.0, disturb: float = 0.0,
          rule: float = RULE, prior: NightPrior | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One session through the gate's pipeline (gate/pipeline.py: the looks, the machine factor, BH over the
    family): (verdicts [test, metric], runs per arm per test, speedup MDE per test). ``extra``: an sd of
    tonight's own night effect on the ratios that the stored nights did not show (nights recorded back to
    back understate it). ``disturb``, ``rule``: each run's chance of being disturbed, and ``max_run_slowdown``."""
    def shared_draw() -> dict[str, float]:
        return {m: rng.normal(0.0, noise.shared[m]) for m in GATED}

    stored: list[list[dict]] = [[] for _ in range(TESTS)]
    for j in range(nights):
        sh = shared_draw()
        for t in range(TESTS):
            stored[t].append(_ruled(_night(rng, noise, sh, looks[0], f"night-{j}", disturb=disturb), looks[0], rule))
    files = [{"sessions": sessions} for sessions in stored]
    pipeline = Pipeline(Stored(tuple(files), floor, prior), ALPHA, "bh")
    sh = shared_draw()
    family = []
    for t in range(TESTS):
        tonight = _night(rng, noise, sh, looks[-1], "tonight", slowdown if t == 0 else 1.0, extra, disturb)
        c = Judgement(Plan(path=Path(f"test-{t}"), status="compared", checked=True, comparability={}, under_test={},
                           baseline=files[t], alpha=ALPHA, gate=GATED, thresholds=thresholds, max_looks=len(looks)))
        c = sequential(pipeline, c, looks, partial(_first, tonight, rule=rule), tonight_log=lambda _: None)
        family.append((f"test-{t}", c))
    _, family = pipeline.finish(family, thresholds)
    runs = np.array([c.looks[-1] for _, c in family])
    gated = [{v.metric: v for v in c.final or []} for _, c in family]
    verdicts = np.array([[g[m].verdict for m in GATED] for g in gated])
    mde = np.array([g["speedup"].mde if g["speedup"].mde is not None else np.nan for g in gated])
    return verdicts, runs, mde


def scenario(rng: np.random.Generator, suites: int, noise: Noise, profile: str, nights: int,
             slowdown: float = 1.0, extra: float = 0.0, disturb: float = 0.0, rule: float = RULE,
             prior: NightPrior | None = None) -> dict[str, float]:
    """Share of suites with any gated `regressed` (any false call), speedup verdict shares, runs, MDE."""
    thresholds, looks, floor = profile_gate(profile)
    i = GATED.index("speedup")
    truth = np.zeros((TESTS, len(GATED)), bool)  # cells whose true value changed
    if slowdown != 1.0:
        truth[0, i] = truth[0, GATED.index("e2e_p95_ratio")] = True
    any_reg = any_call = caught = unchanged = 0.0
    runs, mdes = [], []
    for _ in range(suites):
        v, r, mde = suite(rng, noise, thresholds, nights, looks, floor, slowdown, extra, disturb, rule, prior)
        any_reg += bool((v[~truth] == "regressed").any())
        any_call += bool(np.isin(v[~truth], ("regressed", "improved")).any())
        caught += v[0, i] == "regressed"
        unchanged += float((v[:, i] == "unchanged").mean())
        runs.append(r.mean())
        mdes.append(float(np.median(mde)))
    return {"false_regressed": any_reg / suites, "any_call": any_call / suites, "caught": caught / suites,
            "speedup_unchanged": unchanged / suites, "runs": float(np.mean(runs)), "mde": float(np.median(mdes))}


def new_host(rng: np.random.Generator, cpu: Noise, suites: int, power_suites: int, other: str | None = None) -> int:
    """A new host: one stored night per test, then tonight. Each test's night effect on the ratios has sd
    ``night`` (the host's own, which the one stored night cannot show), on top of the measured run noise; the
    gate judges with the cpu profile's night prior, or without one (run against run, as before the prior)."""
    from pytest_specdec.profiles import load_profile

    profile = load_profile("cpu")
    prior = night_prior_from(profile.night_prior, profile.night_prior_source)
    name = "cpu profile"
    if other:
        sd, df = (float(x) for x in other.split(","))
        prior, name = NightPrior({**prior.sd, "ratio": sd}, df, f"--prior {other}"), f"{sd:g} % at {df:g} df"
    print(f"\nA new host: {TESTS} tests x {len(GATED)} gated metrics, 1 stored night of {profile_gate('cpu')[1][0]} "
          f"pairs per test; run noise as measured; each test's night effect on the ratios drawn with the sd below "
          f"(stored night and tonight alike); BH at alpha {ALPHA}\n")
    print("| test's night sd (log) | true speedup change | night prior | suites | any false `regressed` | "
          "any false call (`regressed` or `improved`) | lone drop `regressed` |")
    print("|---|---|---|---|---|---|---|")
    for night_sd in (0.05, 0.10, 0.15, 0.20):
        noise = Noise(run=cpu.run, night={**cpu.night, "speedup": night_sd, "e2e_p95_ratio": night_sd},
                      shared={m: 0.0 for m in GATED})
        for slow in (1.0, 0.6, 0.4):
            for with_prior in (False, True):
                n = suites if slow == 1.0 else power_suites
                r = scenario(rng, n, noise, "cpu", 1, slow, prior=prior if with_prior else None)
                change = "none (A/A)" if slow == 1.0 else f"{100 * (slow - 1):+.0f} % in 1 test"
                caught = "" if slow == 1.0 else f"{r['caught']:.3f}"
                print(f"| {night_sd:g} | {change} | {name if with_prior else 'none (runs only)'} | {n} | "
                      f"{r['false_regressed']:.3f} | {r['any_call']:.3f} | {caught} |", flush=True)
    return 0


DESCRIPTIONS = {
    "aa": "A/A: suites with any gated false `regressed`",
    "unchanged": "A/A: share of tests with speedup `unchanged`",
    "power": "lone speedup drop in one test: share called `regressed`",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", type=int, default=1000, help="simulated suites per A/A row")
    ap.add_argument("--power-suites", type=int, default=400, help="simulated suites per power row")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--baselines", type=Path, default=ROOT / "baselines" / "cpu")
    ap.add_argument("--disturbed-only", action="store_true", help="only the disturbed-run rule's rows")
    ap.add_argument("--new-host", action="store_true",
                    help="a host with one stored night and an unknown night sd: the gate with and without the "
                         "cpu profile's night prior")
    ap.add_argument("--prior", metavar="SD,DF", default=None,
                    help="with --new-host: the ratios' night prior to judge with, sd in %% and df (default: the cpu "
                         "profile's night_prior)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    cpu = measured_noise(args.baselines)
    if args.new_host:
        return new_host(rng, cpu, args.suites, args.power_suites, args.prior)
    print(f"noise measured on {args.baselines} (sd on the comparison scale: log, or fraction for acceptance):")
    for m in GATED:
        print(f"  {m}: run {cpu.run[m]:.4f}, night {cpu.night[m]:.4f}, shared by all tests {cpu.shared[m]:.4f}")
    rows = [("cpu", cpu, "cpu", 5, 1.0, 0.0), ("cpu", cpu, "cpu", 3, 1.0, 0.0),
            ("cpu", cpu, "cpu", 5, 1.0, 0.05), ("cpu", cpu, "cpu", 5, 1.0, 0.10),
            ("cpu", cpu, "cpu", 5, 0.80, 0.0), ("cpu", cpu, "cpu", 5, 0.70, 0.0), ("cpu", cpu, "cpu", 5, 0.60, 0.0),
            ("gpu-like", gpu_noise(), "h100", 5, 1.0, 0.0), ("gpu-like", gpu_noise(), "h100", 5, 0.90, 0.0)]
    # The disturbed-run rule: what runs at a third of the speed (one in a hundred, one in twenty) do with and
    # without it, and what the rule costs where no run is disturbed.
    disturbed_rows = [(slow, p, rule) for slow in (1.0, 0.70) for p in (0.0, 0.01, 0.05) for rule in (0.0, RULE)]
    (_, cpu_looks, cpu_floor), (_, gpu_looks, _) = profile_gate("cpu"), profile_gate("h100")
    print(f"\n{TESTS} tests x {len(GATED)} gated metrics; pairs per look {cpu_looks} (cpu, night sd floor "
          f"{cpu_floor:g} %), {gpu_looks} (h100); BH at alpha {ALPHA}; "
          f"machine speed per night uniform in 0.75..1.25 for both arms; disturbed-run rule at {RULE:.0%}\n")
    if not args.disturbed_only:
        print("| noise | thresholds | nights | tonight's extra night sd | true speedup change | suites | "
              "any false `regressed` | any call | speedup `unchanged` | lone drop `regressed` | mean pairs | "
              "median speedup MDE |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for noise_name, noise, prof, nights, slow, extra in rows:
            n = args.suites if slow == 1.0 else args.power_suites
            t0 = time.monotonic()
            r = scenario(rng, n, noise, prof, nights, slow, extra)
            change = "none (A/A)" if slow == 1.0 else f"{100 * (slow - 1):+.0f} % in 1 test"
            caught = "" if slow == 1.0 else f"{r['caught']:.3f}"
            print(f"| {noise_name} | {prof} | {nights} | {extra:g} | {change} | {n} | {r['false_regressed']:.3f} | "
                  f"{r['any_call']:.3f} | {r['speedup_unchanged']:.3f} | {caught} | {r['runs']:.2f} | "
                  f"{r['mde']:.1f} % |", flush=True)
            print(f"<!-- {time.monotonic() - t0:.0f} s -->", file=sys.stderr)
        print()
    print("Disturbed runs (cpu noise, 5 stored nights; a disturbed run runs at a third of the speed, in the stored "
          "nights and tonight alike):\n")
    print("| true speedup change | runs disturbed | rule | suites | any false `regressed` | any call | "
          "speedup `unchanged` | lone drop `regressed` | mean pairs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for slow, p, rule in disturbed_rows:
        n = args.suites if slow == 1.0 else args.power_suites
        r = scenario(rng, n, cpu, "cpu", 5, slow, 0.0, p, rule)
        change = "none (A/A)" if slow == 1.0 else f"{100 * (slow - 1):+.0f} % in 1 test"
        caught = "" if slow == 1.0 else f"{r['caught']:.3f}"
        print(f"| {change} | {p:.0%} of runs | {'off' if not rule else f'{rule:.0%}'} | {n} | "
              f"{r['false_regressed']:.3f} | {r['any_call']:.3f} | {r['speedup_unchanged']:.3f} | {caught} | "
              f"{r['runs']:.2f} |", flush=True)
    print("\n" + "\n".join(f"- {d}" for d in DESCRIPTIONS.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
