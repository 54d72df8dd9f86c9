"""`pytest-specdec convert-schema`: older baseline and results files brought to the current schema, every night kept,
and what the plugin's readers then read from them; the plugin itself names the command for an older file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_specdec.formats import BASELINE_SCHEMA, CALIBRATION_SCHEMA, RESULTS_SCHEMA, SWEEP_SCHEMA
from pytest_specdec.gate.baselines import BaselineError, load, night_entry
from pytest_specdec.gate.nights import Night
from pytest_specdec.output import report
from pytest_specdec.output.schema import ResultsError
from pytest_specdec.output.schema import load as load_results
from pytest_specdec.output.sweeps import regime_limits

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "baselines"


#: The command as a user runs it, wherever the package is installed (`pytest-specdec convert-schema`).
COMMAND = [sys.executable, "-m", "pytest_specdec.cli", "convert-schema"]


def convert(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *map(str, paths)], capture_output=True, text=True, cwd=ROOT, timeout=120)


def convert_file(path: Path) -> str:
    """What the command says of one file (exit 0)."""
    out = convert(path)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def old_run(index: int, tok_s: float, spec: bool) -> dict[str, Any]:
    """A run as schema 1 stored it: `itl_ms`, no `latency_untrusted`."""
    return {
        "index": index, "valid": True, "invalid_reasons": [], "output_tok_s": tok_s, "n_requests": 8,
        "total_output_tokens": 512, "drafts": 100 if spec else None, "draft_tokens": 300 if spec else None,
        "accepted_tokens": 180 if spec else None, "accepted_per_pos": [80, 60, 40] if spec else None,
        "acceptance_rate": 0.6 if spec else None, "draft_coverage": 1.0 if spec else None,
        "ttft_ms": {"p50": 15.0, "p95": 19.0, "p99": 21.0}, "tpot_ms": {"p50": 1.8, "p95": 1.9, "p99": 2.0},
        "itl_ms": {"p50": 1.2, "p95": 4.5, "p99": 4.9}, "e2e_ms": {"p50": 130.0, "p95": 139.0, "p99": 140.0},
        "hd_p95_ms": {"tpot": 1.9 + index, "ttft": 20.0, "e2e": 139.0 + index},
    }


def old_baseline(log_line: bool = False) -> dict[str, Any]:
    engine = ({"spec": {"speculative_config": "SpeculativeConfig(method='eagle3'", "max_seq_len": "1024"}}
              if log_line else {"spec": {"config_source": "server_info", "max_model_len": 1024}})
    return {"schema": 1, "nodeid": "t.py::test_a", "profile": "cpu", "comparability": {"hardware": "AMD EPYC"},
            "under_test": {"vllm": "0.31.0", "engine_config": engine},
            "sessions": [{"started": f"2026-11-2{n}T03:00:00Z", "under_test": {"vllm": "0.31.0"},
                          "runs": {"reference": [old_run(i, 500.0 + n, False) for i in range(3)],
                                   "spec": [old_run(i, 600.0 + n, True) for i in range(3)]},
                          "speedup_per_pair": [1.2, 1.2, 1.2]} for n in range(3)]}


def test_a_baseline_keeps_its_nights_and_gives_the_same_values(tmp_path: Path) -> None:
    """Schema 1 → current: every night and run kept, runs under the registry's names, and every verdict metric's
    per-run values as the plugin read the schema-1 file (its runs were trusted: no `latency_untrusted`)."""
    old = old_baseline()
    path = tmp_path / "test_a.json"
    path.write_text(json.dumps(old))
    with pytest.raises(BaselineError, match=re.escape(f"`pytest-specdec convert-schema {path}`")):
        load(path, "c")
    assert convert_file(path) == (f"converted {path}: baseline schema 1 → {BASELINE_SCHEMA} "
                                          "(sessions, runs (3, 18) kept)")
    new = load(path, "c")
    assert new is not None and new["schema"] == BASELINE_SCHEMA
    run = new["sessions"][0]["runs"]["spec"][0]
    assert "itl_ms" not in run and run["itl_token_ms"] == {"p50": 1.2, "p95": 4.5, "p99": 4.9}
    assert run["latency_untrusted"] == [] and run["itl_chunk_ms"] is None
    assert [night_entry(Night.from_entry(s)) for s in new["sessions"]] == new["sessions"]  # the record holds it all
    values = Night.from_entry(new["sessions"][1]).metric_values()
    assert values["per_position_acceptance[0]"] == [0.8] * 3 and values["tpot_p95_ms"] == [1.9, 2.9, 3.9]
    assert values["e2e_p95_ratio"] == [1.0] * 3 and values["output_tok_s"] == [601.0] * 3
    assert convert_file(path) == f"current {path}: baseline schema {BASELINE_SCHEMA}"


def test_a_log_line_engine_config_is_marked_as_such(tmp_path: Path) -> None:
    path = tmp_path / "test_a.json"
    path.write_text(json.dumps(old_baseline(log_line=True)))
    convert_file(path)
    new = json.loads(path.read_text())
    assert new["under_test"]["engine_config"]["spec"]["config_source"] == "log line (schema 1)"
    assert "config_source" not in new["sessions"][0]["under_test"]  # only the file's own record, as before


def old_results() -> dict[str, Any]:
    """A results file as schema 1 wrote it, field by field as it grew."""
    spec = {"arm": "spec", "index": 0, "valid": True, "invalid_reasons": [], "output_tok_s": 600.0, "n_requests": 8,
            "total_output_tokens": 512, "drafts": 187, "draft_tokens": 561, "accepted_tokens": 325,
            "per_position_acceptance": [146 / 187, 102 / 187, 77 / 187], "acceptance_rate": 325 / 561,
            "draft_coverage": 1.0, "ttft_ms": None, "tpot_ms": None, "itl_token_ms": None, "itl_chunk_ms": None,
            "e2e_ms": None, "hd_p95_ms": {"tpot": 2.0, "ttft": 20.0, "e2e": 140.0}}
    ref = {**spec, "arm": "reference", "output_tok_s": 500.0, "drafts": None, "draft_tokens": None,
           "accepted_tokens": None, "per_position_acceptance": None, "acceptance_rate": None, "draft_coverage": None}
    return {
        "schema": 1, "started": "2026-11-24T03:00:00+00:00", "machine_factor": None,
        "gate": {"settings": {"alpha": 0.05, "fdr": "holm", "min_night_sd": 6.0}},
        "environment": {"workarounds": [{"name": "patch-x", "detail": "why"}, "plain"]},
        "servers": {"s": {"engine_config": {"compilation_config": "{'level': 3, 'cudagraph_capture_sizes': [1, 512]}",
                                            "max_num_batched_tokens": "2048"}, "command": []}},
        "tests": [
            {"nodeid": "t.py::test_a", "outcome": "passed", "runs": [spec], "reference_runs": [ref],
             "speedup_per_pair": [1.2], "summary": {"output_tps": 600.0, "reference_output_tps": 500.0, "itl_ms": None},
             "verdicts": {"speedup": {"verdict": "regressed", "note": "Δ -20 % (90% CI -25 % to -15 %)"},
                          "output_tok_s": {"verdict": "inconclusive"}},
             "baseline": {"gate": ["speedup"], "alpha": 0.05, "max_looks": 2}},
            {"nodeid": "t.py::test_b", "outcome": "failed (setup)",
             "verdicts": {"speedup": {"verdict": "inconclusive", "note": "(95% CI ...)"}}, "baseline": {}},
        ],
    }


def test_a_results_file_gets_what_each_missing_field_meant(tmp_path: Path) -> None:
    """Schema 1 → current: the outcome's phase becomes `when`; a verdict without `family` is gated unless its
    baseline's `gate` says otherwise, without `mde` no variance model; `ci_level` from `alpha` and `max_looks`,
    else from the notes; a workaround's `detail` is its reason; the summary takes the registry's names; a run
    carries its accepted tokens per position as counts; a printed engine config its numbers; the gate's setting
    `fdr` is `multiplicity`."""
    old = old_results()
    path = tmp_path / "specdec.json"
    path.write_text(json.dumps(old))
    with pytest.raises(ResultsError, match=re.escape(f"convert it, keeping its tests and runs, with "
                                                     f"`pytest-specdec convert-schema {path}`")):
        load_results(old, str(path))
    assert convert_file(path).startswith(f"converted {path}: results schema 1 → {RESULTS_SCHEMA}")
    new = json.loads(path.read_text())
    a, b = load_results(new, str(path)).tests
    assert (a.outcome, a.when, b.outcome, b.when) == ("passed", "call", "failed", "setup")
    assert a.verdicts["speedup"].family == "gated" and a.verdicts["output_tok_s"].family == "shown"
    assert a.verdicts["speedup"].mde is None and report.catches(a.verdicts["speedup"]) == "no variance model"
    assert a.baseline is not None and a.baseline.ci_level == pytest.approx(0.95)  # 1 - 2·0.05/2
    assert b.baseline is not None and b.baseline.ci_level == pytest.approx(0.95)  # from the note
    assert a.baseline.inconclusive_gated == () and b.baseline.inconclusive_gated == ("speedup",)
    assert a.summary == {"output_tok_s": 600.0, "reference_tok_s": 500.0, "itl_token_ms": None}
    assert a.runs[0]["accepted_per_pos"] == [146, 102, 77] and a.reference_runs[0]["accepted_per_pos"] is None
    assert a.night.metric_values()["per_position_acceptance[1]"] == [102 / 187]
    assert new["environment"]["workarounds"] == [{"name": "patch-x", "applied": True, "reason": "why"},
                                                 {"name": "plain", "applied": True, "reason": None}]
    assert regime_limits(new["servers"]["s"]) == [(512, "CUDA-graph capture size"), (2048, "max_num_batched_tokens")]
    assert new["gate"]["settings"] == {"alpha": 0.05, "multiplicity": "holm", "min_night_sd": 6.0}
    assert convert_file(path) == f"current {path}: results schema {RESULTS_SCHEMA}"


def test_the_command_converts_folders_skips_other_json_and_names_what_it_cannot(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "test_a.json").write_text(json.dumps(old_baseline()))
    crossover = next(BASELINES.rglob("*.crossover"))  # a committed record: current, found by its suffix
    (tmp_path / "cpu" / "sweep.crossover").write_text(crossover.read_text(encoding="utf-8"))
    calibration = next(BASELINES.rglob("*.calibration"))  # likewise, told from a baseline by its named schema
    (tmp_path / "cpu" / "host.calibration").write_text(calibration.read_text(encoding="utf-8"))
    (tmp_path / "bench.json").write_text("{}")
    (tmp_path / "new.json").write_text(json.dumps({"schema": 99, "tests": []}))
    out = convert(tmp_path / "cpu", tmp_path / "bench.json")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"current {tmp_path / 'cpu' / 'host.calibration'}: calibration record schema {CALIBRATION_SCHEMA}",
        f"current {tmp_path / 'cpu' / 'sweep.crossover'}: crossover record schema {SWEEP_SCHEMA}",
        f"converted {tmp_path / 'cpu' / 'test_a.json'}: baseline schema 1 → {BASELINE_SCHEMA} "
        "(sessions, runs (3, 18) kept)",
        f"skipped {tmp_path / 'bench.json'}: not a calibration record, baseline, crossover record or results file "
        "(no `schema`)"]
    bad = convert(tmp_path / "new.json")
    assert bad.returncode == 2 and bad.stderr == (
        f"pytest-specdec convert-schema: error: {tmp_path / 'new.json'}: results schema 99 is not one this "
        f"command converts (1 to {RESULTS_SCHEMA - 1})\n")


def test_a_conversion_that_would_not_read_back_writes_nothing(tmp_path: Path) -> None:
    old = old_baseline()
    old["sessions"][0]["runs"]["spec"][0]["output_tok_s"] = "fast"
    path = tmp_path / "b.json"
    path.write_text(json.dumps(old))
    out = convert(path)
    assert out.returncode == 2 and re.search(r"does not read back .*output_tok_s is 'fast'.*nothing written",
                                             out.stderr)
    assert json.loads(path.read_text()) == old
