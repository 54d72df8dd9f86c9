"""Convert baseline and results files of an older schema to the current one, in place, keeping every night:
`pytest-specdec convert-schema PATH...` (the command `formats.CONVERT` that the readers name for an older file).

A directory is searched for *.json; a file of the current schema is left as it is, and a file that is neither a
baseline nor a results file is named and skipped. The readers (`gate/baselines.py`, `output/schema.py`) read
only the current schema and name this command for an older file; the steps between the schemas live here
alone, so no reader guesses which version wrote a field:

* baselines, schema 1 → 2: an engine config stored from vLLM's log line (no `config_source`) is marked
  `config_source: "log line (schema 1)"`; 2 → 3: each run takes the registry's names (`itl_ms` →
  `itl_token_ms`) and every field of the run record, with what its absence meant (`latency_untrusted: []`:
  trusted; `invalid_reasons: []`; a figure never recorded: null);
* results, schema 1 → 2: fields schema 1 grew one by one get what their absence meant (`_results_from_1`);
  2 → 3: the summary takes the registry's names; 3 → 4: each run carries the run record's
  `accepted_per_pos` (accepted tokens per draft position as counts: its rates times its drafts), and an
  engine config printed as vLLM's text gets its capture size and token budget as numbers; 4 → 5:
  `gate.settings.fdr` is `gate.settings.multiplicity` (it holds `bh` or `holm`, and Holm is no FDR method).

Each converted file is read back by the plugin's own reader, and keeps as many sessions, tests and runs as it
had; otherwise nothing is written and the command fails naming the file.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_specdec.errors import SpecDecError
from pytest_specdec.formats import BASELINE_SCHEMA, CONVERT, RESULTS_SCHEMA
from pytest_specdec.gate.baselines import BaselineError, render
from pytest_specdec.gate.baselines import load as load_baseline
from pytest_specdec.gate.kinds import GATED, INCONCLUSIVE, SHOWN
from pytest_specdec.measure.record import OPTIONAL_RUN_FIELDS, RUN_FIELDS
from pytest_specdec.output.fields import number
from pytest_specdec.output.results import render_results
from pytest_specdec.output.schema import ResultsError
from pytest_specdec.output.schema import load as load_results


class ConvertError(SpecDecError):
    """A file that cannot be converted; the message names it."""


# ---- baselines ------------------------------------------------------------------------------------------

#: `config_source` of an engine config that schema 1 kept as vLLM's log line printed it.
LOG_LINE_ERA = "log line (schema 1)"


def run_record(run: dict[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    """One stored run with the run record's fields: ``renamed`` old names → new, the validity lists empty
    where absent (valid and trusted, as their absence meant), any other absent field null (not recorded),
    except `hd_p95_ms`, an empty map, and the optional ones (goodput), left absent."""
    out = {renamed.get(k, k): v for k, v in run.items()}
    out.setdefault("invalid_reasons", [])
    out.setdefault("latency_untrusted", [])
    out.setdefault("hd_p95_ms", {})
    for key in [k for k in RUN_FIELDS if k not in OPTIONAL_RUN_FIELDS]:
        out.setdefault(key, None)
    return out


def baseline_from_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: engine configs without `config_source` were stored from vLLM's log line."""
    for config in (data["under_test"].get("engine_config") or {}).values():
        if isinstance(config, dict) and config and "config_source" not in config:
            config["config_source"] = LOG_LINE_ERA
    data["schema"] = 2
    return data


def baseline_from_2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 → 3: every run is a full run record under the registry's names; a session without
    `under_test` or `speedup_per_pair` records none."""
    for session in data["sessions"]:
        session.setdefault("under_test", {})
        session.setdefault("speedup_per_pair", [])
        session.setdefault("started", "")
        runs = session["runs"]
        for arm in ("reference", "spec"):
            runs[arm] = [run_record(r, {"itl_ms": "itl_token_ms"}) for r in runs[arm]]
    data["schema"] = 3
    return data


def convert_baseline(data: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    if out["schema"] == 1:
        out = baseline_from_1(out)
    return baseline_from_2(out)


def baseline_counts(data: Mapping[str, Any]) -> tuple[int, int]:
    """(sessions, runs) of a baseline file."""
    sessions = data["sessions"]
    return len(sessions), sum(len(s["runs"][arm]) for s in sessions for arm in ("reference", "spec"))


# ---- results ----------------------------------------------------------------------------------------------

#: Schema-1 outcomes of a test that failed or skipped outside its call: "failed (setup)".
_PHASED = re.compile(r"(\w+) \((setup|call|teardown)\)")
#: The level a schema-1 verdict's note named ("90% CI ..."), for the files that recorded no `ci_level`.
_CI_IN_NOTE = re.compile(r"(\d+(?:\.\d+)?)% CI\b")
#: Schema 2 named the summary's throughputs and per-token ITL apart from the runs and the verdicts.
_SUMMARY_NAMES_2 = {"output_tps": "output_tok_s", "reference_output_tps": "reference_tok_s", "itl_ms": "itl_token_ms"}


def _runs(test: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    return (*(test.get("runs") or ()), *(test.get("reference_runs") or ()))


def results_from_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 grew field by field; each missing field gets the value its absence meant:

    - `outcome` "failed (setup)" splits into `outcome` and `when`; a run without `valid` or
      `latency_untrusted` was valid and trusted;
    - a verdict without `family` could fail its test: gated (or as its baseline's `gate` says);
      without `mde`/`se`/`df` no variance model was recorded;
    - a baseline without `ci_level` gets it from `alpha` and `max_looks`, else from its verdicts' notes (a
      level given in percent becomes a fraction); without `inconclusive_gated`, from its verdicts;
    - the machine factor's `line` (prose) goes; a workaround without `applied` was applied, its `detail`
      is its `reason`.
    """
    for test in data.get("tests") or []:
        outcome = str(test.get("outcome") or "pending")
        phased = _PHASED.fullmatch(outcome)
        test["outcome"], test["when"] = ((phased[1], phased[2]) if phased else
                                         (outcome, "call" if outcome in ("passed", "failed", "skipped") else None))
        verdicts = test.get("verdicts") or {}
        baseline = test.get("baseline")
        gate = (baseline or {}).get("gate")
        for metric, v in verdicts.items():
            v.setdefault("family", GATED if not gate or metric in gate else SHOWN)
            for key in ("mde", "se", "df"):
                v.setdefault(key, None)
        for run in _runs(test):
            run.setdefault("valid", True)
            run.setdefault("latency_untrusted", [])
        if isinstance(baseline, dict):
            level = number(baseline["ci_level"]) if "ci_level" in baseline else _ci_level_1(baseline, verdicts)
            baseline["ci_level"] = (None if level is None or not 0 < level < 100
                                    else level / 100 if level >= 1 else level)
            baseline.setdefault("inconclusive_gated", [m for m, v in verdicts.items()
                                                       if v["family"] == GATED and v.get("verdict") == INCONCLUSIVE])
    machine = data.get("machine_factor")
    if isinstance(machine, dict):
        machine.pop("line", None)
    env = data.get("environment") or {}
    env["workarounds"] = [_workaround_1(w) for w in env.get("workarounds") or []]
    data["schema"] = 2
    return data


def _ci_level_1(baseline: Mapping[str, Any], verdicts: Mapping[str, Mapping[str, Any]]) -> float | None:
    alpha, looks = number(baseline.get("alpha")), baseline.get("max_looks")
    if alpha is not None and 0 < alpha < 0.5:
        return 1 - 2 * alpha / (looks if isinstance(looks, int) and looks >= 1 else 1)
    for v in verdicts.values():
        m = _CI_IN_NOTE.search(str(v.get("note") or ""))
        if m:
            return float(m.group(1)) / 100
    return None


def _workaround_1(w: Any) -> dict[str, Any]:
    if not isinstance(w, dict):
        return {"name": str(w), "applied": True, "reason": None}
    out = dict(w)
    out.setdefault("applied", True)
    out.setdefault("reason", out.pop("detail", None))
    return out


def results_from_2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 → 3: a test's summary takes the registry's names (`output_tok_s`, `reference_tok_s`,
    `itl_token_ms`), as its runs and verdicts always had."""
    for test in data.get("tests") or []:
        summary = test.get("summary")
        if isinstance(summary, dict):
            test["summary"] = {_SUMMARY_NAMES_2.get(k, k): v for k, v in summary.items()}
    data["schema"] = 3
    return data


def accepted_counts(run: Mapping[str, Any]) -> list[int] | None:
    """A results run's accepted tokens per draft position as counts (its rates times its drafts)."""
    drafts, per_pos = run.get("drafts"), run.get("per_position_acceptance")
    return [round(a * drafts) for a in per_pos] if per_pos and drafts else None


def printed_capture_size(config: Mapping[str, Any]) -> int | None:
    """The largest CUDA-graph capture size in an engine config's text values: older results files kept
    compilation_config as vLLM printed it (`{'cudagraph_capture_sizes': [1, 2, 512], ...}`)."""
    text = " ".join(v for v in config.values() if isinstance(v, str))
    m = re.search(r"max_cudagraph_capture_size['\"]?\s*[:=]\s*(\d+)", text)
    if m:
        return int(m.group(1))
    sizes = re.search(r"cudagraph_capture_sizes['\"]?\s*[:=]\s*\[([^\]]*)\]", text)
    found = re.findall(r"\d+", sizes.group(1)) if sizes else []
    return max(int(x) for x in found) if found else None


def _flat_numbers(config: dict[str, Any]) -> None:
    """An engine config's capture size and token budget as numbers, where an older file kept them as text."""
    for key in ("max_cudagraph_capture_size", "max_num_batched_tokens"):
        if isinstance(config.get(key), str) and config[key].isdecimal():
            config[key] = int(config[key])
    if "max_cudagraph_capture_size" not in config and not isinstance(config.get("cudagraph_capture_sizes"), list):
        size = printed_capture_size(config)
        if size is not None:
            config["max_cudagraph_capture_size"] = size


def results_from_3(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 → 4: runs carry the run record's fields (`accepted_per_pos`, and any a file lacks: null);
    engine configs their capture size and token budget as numbers."""
    for test in data.get("tests") or []:
        for key in ("runs", "reference_runs"):
            if key in test:
                test[key] = [run_record({**r, "accepted_per_pos": accepted_counts(r)}, {}) for r in test[key]]
    for server in (data.get("servers") or {}).values():
        if isinstance(server, dict) and isinstance(server.get("engine_config"), dict):
            _flat_numbers(server["engine_config"])
    data["schema"] = 4
    return data


def results_from_4(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 4 → 5: the gate's setting `fdr` is `multiplicity`, in its place among the settings."""
    gate = data.get("gate")
    if isinstance(gate, dict) and isinstance(gate.get("settings"), dict) and "fdr" in gate["settings"]:
        gate["settings"] = {("multiplicity" if k == "fdr" else k): v for k, v in gate["settings"].items()}
    data["schema"] = 5
    return data


def convert_results(data: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for version, step in ((1, results_from_1), (2, results_from_2), (3, results_from_3), (4, results_from_4)):
        if out["schema"] == version:
            out = step(out)
    return out


def results_counts(data: Mapping[str, Any]) -> tuple[int, int]:
    """(tests, runs) of a results file."""
    tests = data.get("tests") or []
    return len(tests), sum(len(list(_runs(t))) for t in tests)


# ---- files ------------------------------------------------------------------------------------------------


def convert_file(path: Path) -> str:
    """Convert one file in place; what was done, as one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConvertError(f"{path}: cannot be read as JSON ({exc})") from None
    version = data.get("schema") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(version, int):
        return f"skipped {path}: not a baseline or results file (no `schema`)"
    text: Callable[[dict[str, Any]], str]
    if "sessions" in data:
        kind, current, convert, counts = "baseline", BASELINE_SCHEMA, convert_baseline, baseline_counts
        text = render
    elif "tests" in data:
        kind, current, convert, counts = "results", RESULTS_SCHEMA, convert_results, results_counts
        text = render_results
    else:
        return f"skipped {path}: not a baseline or results file (no `sessions` or `tests`)"
    if version == current:
        return f"current {path}: {kind} schema {version}"
    if not 1 <= version < current:
        raise ConvertError(f"{path}: {kind} schema {version} is not one this command converts (1 to {current - 1})")
    try:
        new = convert(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConvertError(f"{path}: not a {kind} file as schema {version} wrote it ({exc!r} is missing or "
                           "malformed)") from None
    if counts(new) != counts(data):
        raise ConvertError(f"{path}: the conversion would change its {kind} counts {counts(data)} → {counts(new)}")
    written = text(new)
    try:  # the plugin's own reader: what it cannot read is not written
        if kind == "baseline":
            with tempfile.TemporaryDirectory() as tmp:
                check = Path(tmp) / path.name
                check.write_text(written, encoding="utf-8")
                load_baseline(check, CONVERT)
        else:
            load_results(json.loads(written), str(path))
    except (BaselineError, ResultsError) as exc:
        raise ConvertError(f"{path}: converted, it does not read back ({exc}); nothing written") from None
    path.write_text(written, encoding="utf-8")
    what = "sessions, runs" if kind == "baseline" else "tests, runs"
    return f"converted {path}: {kind} schema {version} → {current} ({what} {counts(new)} kept)"


def files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(p.rglob("*.json"))
        elif p.exists():
            out.append(p)
        else:
            raise ConvertError(f"{p}: no such file or directory")
    return out


def convert_paths(paths: Iterable[Path]) -> Iterator[str]:
    """Convert every baseline and results file among ``paths`` (directories searched for *.json), one line per
    file as it is done. The first file that cannot be converted stops it with a ConvertError naming that file."""
    for path in files(paths):
        yield convert_file(path)
