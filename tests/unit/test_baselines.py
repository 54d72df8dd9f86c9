"""baselines.py: paths, identities, deterministic files, reading errors, and the queued writes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from factories import PER_POS, run_entry

from pytest_specdec.formats import BASELINE_SCHEMA
from pytest_specdec.gate.baselines import (
    BaselineError,
    baseline_path,
    diff,
    load,
    metric_values,
    model_identity,
    night_entry,
    render,
)
from pytest_specdec.gate.store import BaselineStore, Pending
from pytest_specdec.zoo import MODELS_DIR


def run(index: int, tok_s: float, valid: bool = True, spec: bool = True) -> dict[str, Any]:
    """A stored run with its TPOT distribution: a spec run (acceptance 0.6) or a reference run."""
    return run_entry(index, tok_s, per_pos=PER_POS if spec else None,
                     invalid=None if valid else "1/8 requests failed", tpot_ms={"p50": 4.0, "p95": 5.0, "p99": 6.0},
                     hd_p95_ms={"tpot": 5.0 + index, "ttft": 20.0, "e2e": 100.0})


#: The machine the store tests' files are measured on.
HERE = {"hardware": "AMD EPYC", "device": "cpu", "device_count": 2}


def entry(scale: float = 1.0) -> dict[str, Any]:
    return {
        "started": "2026-01-01T00:00:00Z", "under_test": {"vllm": "0.32.0"},
        "runs": {"reference": [run(i, 100.0 * scale, spec=False) for i in range(3)],
                 "spec": [run(0, 200.0 * scale), run(1, 210.0 * scale), run(2, 1.0, valid=False)]},
        "speedup_per_pair": [2.0, 2.1, None],
    }


def test_paths_follow_profile_hardware_module_and_test_id(tmp_path: Path) -> None:
    p = baseline_path(tmp_path, "cpu", "amd-epyc-2cpu", "suites/test_methods.py::test_methods[eagle3-k3-t0.0-c1]")
    assert p == tmp_path / "cpu" / "amd-epyc-2cpu" / "suites.test_methods" / "test_methods[eagle3-k3-t0.0-c1].json"
    p = baseline_path(tmp_path, "cpu", "amd-epyc-2cpu", "t.py::TestX::test_y[a/b c]")
    assert p.name == "TestX.test_y[a_b_c].json"


@pytest.mark.parametrize(("hardware", "device", "count", "key"), [
    ("AMD EPYC", "cpu", 2, "amd-epyc-2cpu"),
    ("AMD EPYC 7763 64-Core Processor", "cpu", 4, "amd-epyc-7763-64-core-4cpu"),
    ("Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz", "cpu", 4, "intel-xeon-platinum-8370c-2.80ghz-4cpu"),
    ("Intel(R) Xeon(R) Processor", "cpu", 4, "intel-xeon-4cpu"),
    ("NVIDIA H100 80GB HBM3", "cuda", 8, "nvidia-h100-80gb-hbm3-8gpu"),
    ("../../etc", "cpu", None, "etc"),
])
def test_a_machines_folder_is_a_short_readable_name_of_its_model_and_count(
        hardware: str, device: str, count: int | None, key: str) -> None:
    """The folder of a machine's baselines: its model without trademark signs and the words CPU/Processor,
    and how many CPUs or GPUs; nothing of it can leave the profile's folder."""
    from pytest_specdec.gate.baselines import hardware_key

    assert hardware_key({"hardware": hardware, "device": device, "device_count": count}) == key


def test_model_identity_hashes_local_models_and_names_hub_ones(tmp_path: Path) -> None:
    zoo = model_identity(str(MODELS_DIR / "eagle3"))
    degraded = model_identity(str(MODELS_DIR / "eagle3-degraded"))
    assert zoo["id"] == "eagle3" and len(zoo["sha256"]) == 64 and zoo["sha256"] != degraded["sha256"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    first = model_identity(str(tmp_path / "m"))["sha256"]
    assert model_identity("meta-llama/Llama-3.1-8B", "abc123") == {"id": "meta-llama/Llama-3.1-8B",
                                                                    "revision": "abc123"}
    assert len(first) == 64


def test_metric_values_use_valid_runs_only() -> None:
    vals = metric_values(entry())
    assert vals["speedup"] == [2.0, 2.1]
    assert vals["output_tok_s"] == [200.0, 210.0]  # the invalid third run is left out
    assert vals["reference_tok_s"] == [100.0] * 3
    assert vals["per_position_acceptance[2]"] == [0.4, 0.4]
    assert vals["tpot_p95_ms"] == [5.0, 6.0]


def test_a_dead_spec_arm_never_lends_the_reference_its_latencies() -> None:
    """Every spec run invalid (the spec server died): the spec arm's figures are missing, never the
    reference arm's put in their place; a test without a spec arm (method none) judges the reference's."""
    dead = entry()
    dead["runs"]["spec"] = [run(i, 1.0, valid=False) for i in range(3)]
    dead["speedup_per_pair"] = [None] * 3
    for r in dead["runs"]["reference"]:
        r["hd_p95_ms"] = {"tpot": 99.0, "ttft": 99.0, "e2e": 99.0}
    vals = metric_values(dead)
    assert vals == {"reference_tok_s": [100.0] * 3}
    none = entry()
    none["runs"]["spec"], none["speedup_per_pair"] = [], []
    assert metric_values(none)["tpot_p95_ms"] == [5.0, 6.0, 7.0]


def test_render_is_deterministic_sorted_and_rounded() -> None:
    data = {"b": 1 / 3, "a": [2.0000000001, {"z": 1e-9, "y": None}]}
    text = render(data)
    assert text == render(json.loads(text)) and text.endswith("\n")
    assert list(json.loads(text)) == ["a", "b"] and json.loads(text)["b"] == 0.333333
    with pytest.raises(BaselineError, match="non-finite"):
        render({"x": float("nan")})


def test_load_rejects_bad_files_with_the_fix(tmp_path: Path) -> None:
    p = tmp_path / "b.json"
    assert load(p, "pytest x --update-baselines") is None
    p.write_text("{nope")
    with pytest.raises(BaselineError, match=r"b.json is not valid JSON .*recreate it with `pytest x --update"):
        load(p, "pytest x --update-baselines")
    p.write_text("[1, 2]")  # JSON, but not an object
    with pytest.raises(BaselineError, match=r"b.json is not a JSON object; fix or delete it"):
        load(p, "c")
    p.write_text(json.dumps({"schema": 99}))
    with pytest.raises(BaselineError, match=re.escape(
            f"`schema` is 99; this plugin reads the baseline format of schema {BASELINE_SCHEMA} (a newer plugin wrote "
            "it, or it is not a pytest-specdec baseline file); fix or delete it")):
        load(p, "c")
    p.write_text(json.dumps({"schema": BASELINE_SCHEMA, "comparability": {}, "under_test": {}, "sessions": [{}]}))
    with pytest.raises(BaselineError, match=r"sessions\[0\] has no runs"):
        load(p, "c")


@pytest.mark.parametrize(("edit", "says"), [
    (lambda d: d["sessions"][0]["runs"]["spec"][1].pop("valid"), r"sessions\[0\]\.runs\.spec\[1\] has no `valid`"),
    (lambda d: d["sessions"][0]["runs"]["reference"][0].update(output_tok_s="fast"),
     r"sessions\[0\]\.runs\.reference\[0\]\.output_tok_s is 'fast', not int or float or NoneType"),
    (lambda d: d["sessions"][0]["runs"]["spec"][0].update(index=True),
     r"sessions\[0\]\.runs\.spec\[0\]\.index is True, not int"),
    (lambda d: d["sessions"][0]["runs"]["spec"].__setitem__(2, 7), r"sessions\[0\]\.runs\.spec\[2\] is not an object"),
    (lambda d: d["sessions"][0].update(speedup_per_pair=2.0),
     r"sessions\[0\]\.speedup_per_pair is 2\.0, not list"),
    (lambda d: d["sessions"][0].update(speedup_per_pair=[2.0, "x"]),
     r"sessions\[0\]\.speedup_per_pair\[1\] is 'x', not a number"),
    (lambda d: d["sessions"][0].update(started=["2026"]), r"sessions\[0\]\.started is \['2026'\], not str"),
    (lambda d: d["sessions"][0]["runs"]["spec"][0]["hd_p95_ms"].update(e2e="x"),
     r"sessions\[0\]\.runs\.spec\[0\]\.hd_p95_ms\.e2e is 'x', not a number"),
    (lambda d: d["sessions"][0]["runs"]["spec"][1].update(accepted_per_pos=[80, "a"]),
     r"sessions\[0\]\.runs\.spec\[1\]\.accepted_per_pos\[1\] is 'a', not a number"),
    (lambda d: d["sessions"][0]["runs"]["reference"][2].update(output_tok_s=-3.0),
     r"sessions\[0\]\.runs\.reference\[2\]\.output_tok_s is -3\.0, not a finite number >= 0"),
    (lambda d: d["sessions"][0]["runs"]["reference"][0].update(output_tok_s=float("nan")),
     r"sessions\[0\]\.runs\.reference\[0\]\.output_tok_s is nan, not a finite number >= 0"),
    (lambda d: d["sessions"][0]["runs"]["spec"][0]["hd_p95_ms"].update(tpot=float("inf")),
     r"sessions\[0\]\.runs\.spec\[0\]\.hd_p95_ms\.tpot is inf, not a finite number >= 0"),
    (lambda d: d["sessions"][0]["runs"]["spec"][0].update(acceptance_rate=True),
     r"sessions\[0\]\.runs\.spec\[0\]\.acceptance_rate is True, not int or float or NoneType"),
], ids=["missing", "wrong-type", "bool-index", "not-object", "pairs", "pair-string", "started-list",
        "latency-string", "per-position-string", "negative-rate", "nan", "infinity", "bool-rate"])
def test_a_malformed_stored_run_is_an_error_naming_the_file_and_field(tmp_path: Path, edit: Any, says: str) -> None:
    data = {"schema": BASELINE_SCHEMA, "comparability": {}, "under_test": {}, "sessions": [entry()]}
    p = tmp_path / "b.json"
    p.write_text(json.dumps(data))
    assert load(p, "c") is not None
    edit(data)
    p.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=f"baseline {re.escape(str(p))}: {says}; fix or delete it"):
        load(p, "c")


def test_one_file_with_a_nan_is_left_out_and_the_others_stay_finite(tmp_path: Path) -> None:
    """Every file feeds the night factors and variance priors: a NaN that loaded would make them NaN for
    every compared test. Read as the judge reads the store: a file that does not load is left out."""
    from pytest_specdec.gate.machine import night_factors
    from pytest_specdec.gate.verdicts import priors_from

    for name, scale in (("good", 1.0), ("bad", float("nan"))):
        nights = [entry(1.0) | {"started": "n1"}, entry(1.1) | {"started": "n2"}]
        nights[1]["runs"]["reference"][0]["output_tok_s"] *= scale
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"schema": BASELINE_SCHEMA, "comparability": {}, "under_test": {}, "sessions": nights}))
    stored = []
    for f in sorted(tmp_path.glob("*.json")):
        try:
            stored.append(load(f, "c"))
        except BaselineError as exc:
            assert "bad.json: sessions[1].runs.reference[0].output_tok_s is nan" in str(exc)
    assert len(stored) == 1
    factors = night_factors(stored)
    assert factors and all(math.isfinite(f) for f in factors.values())
    assert all(math.isfinite(p.var) for p in priors_from(stored).values())


def test_diff_lists_dotted_fields() -> None:
    assert diff({"w": {"c": 1, "m": 24}, "x": 1}, {"w": {"c": 1, "m": 20}, "y": 2}) == {
        "w.m": (24, 20), "x": (1, None), "y": (None, 2)}


def test_an_older_baseline_is_an_error_naming_the_conversion_never_read_as_it_is(tmp_path: Path) -> None:
    """A file of an older schema is never reinterpreted: reading it names the command that converts it,
    and --update-baselines leaves it as it is (its nights may not be measurable again) and says so."""
    from pytest_specdec.gate.baselines import OlderBaseline

    stored = {"schema": BASELINE_SCHEMA - 1, "comparability": {"hardware": "cpu"}, "under_test": {},
              "sessions": [entry()]}
    s = BaselineStore(tmp_path, "cpu", HERE, mode="all", keep=5)
    path = s.path("t.py::test_a")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(stored))
    with pytest.raises(OlderBaseline, match=re.escape(
            f"{path}: baseline of schema {BASELINE_SCHEMA - 1}, an older format than this plugin's {BASELINE_SCHEMA}; "
            f"convert it, keeping its sessions and runs, with `pytest-specdec convert-schema {path}`")):
        load(path, "c")
    s.queue(_pending(s, "t.py::test_a", 1.0))
    summary = s.flush()
    assert [p for p, _ in summary.failed] == [path] and not summary.updated
    assert json.loads(path.read_text()) == stored
    assert "no stored file was changed by a failed write. Convert it, then run again" in summary.lines(tmp_path)[0]


def test_a_stored_night_reads_back_to_the_same_entry() -> None:
    """`night_entry(Night.from_entry(x)) == x`: the typed record holds every stored field of a run."""
    from pytest_specdec.gate.nights import Night

    stored = entry()
    assert night_entry(Night.from_entry(stored)) == stored


def test_zoo_paths_under_test_are_portable() -> None:
    from pytest_specdec.gate.baselines import portable
    from pytest_specdec.zoo import MODELS_DIR

    engine = {"model": str(MODELS_DIR / "target"), "tokenizer": "/elsewhere/target",
              "speculative_config": {"model": str(MODELS_DIR / "eagle3")}, "sizes": [1, 2]}
    assert portable(engine) == {"model": "zoo:target", "tokenizer": "/elsewhere/target",
                                 "speculative_config": {"model": "zoo:eagle3"}, "sizes": [1, 2]}


def _pending(store: BaselineStore, nodeid: str, scale: float, comp: dict[str, Any] | None = None,
             change: str = "") -> Pending:
    return Pending(nodeid, store.path(nodeid), comp or {"hardware": "cpu"}, {"vllm": "0.32.0"}, entry(scale), change)


def test_flush_creates_appends_keeps_n_and_reports(tmp_path: Path) -> None:
    def store(mode: str | None = "all") -> BaselineStore:
        return BaselineStore(tmp_path, "cpu", HERE, mode=mode, keep=2)

    s = store()
    s.queue(_pending(s, "t.py::test_a", 1.0))
    summary = s.flush()
    assert [p.name for p in summary.created] == ["test_a.json"]
    path = tmp_path / "cpu" / "amd-epyc-2cpu" / "t" / "test_a.json"
    for scale in (1.1, 1.2):
        s = store()
        s.read("t.py::test_a", "c")
        s.queue(_pending(s, "t.py::test_a", scale))
        summary = s.flush()
    data = json.loads(path.read_text())
    assert len(data["sessions"]) == 2  # keep=2: the oldest was dropped
    assert data["sessions"][-1]["runs"]["spec"][0]["output_tok_s"] == pytest.approx(240.0)
    (_, what), = summary.updated
    assert "speedup 2.049 → 2.049" in what and "output_tok_s 225.4 → 245.9" in what and "1 oldest dropped" in what

    s = store("missing")  # an existing file is left alone; an unused one is listed
    (path.parent / "test_gone.json").write_text(path.read_text())
    s.read("t.py::test_a", "c")
    s.queue(_pending(s, "t.py::test_a", 2.0))
    summary = s.flush()
    assert summary.unchanged and not summary.updated and [p.name for p in summary.unused] == ["test_gone.json"]
    lines = summary.lines(tmp_path)
    assert lines[0].endswith("0 created, 0 updated, 1 unchanged, 1 unused")

    s = store()  # a non-comparable baseline is replaced, and the summary says which fields differed
    s.queue(_pending(s, "t.py::test_a", 1.0, {"hardware": "other"}))
    (_, what), = s.flush().updated
    assert "replaced 2 non-comparable session(s): hardware" in what
    assert len(json.loads(path.read_text())["sessions"]) == 1

    s = store()  # an accepted change starts the history afresh
    s.queue(_pending(s, "t.py::test_a", 0.5, {"hardware": "other"}, change="speedup regressed"))
    (_, what), = s.flush().updated
    assert "accepted a change, speedup regressed" in what and len(json.loads(path.read_text())["sessions"]) == 1
    assert not list(path.parent.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_two_tests_on_one_file_is_an_error(tmp_path: Path) -> None:
    s = BaselineStore(tmp_path, "cpu", HERE, mode="all", keep=5)
    s.queue(_pending(s, "t.py::test_a[x/y]", 1.0))
    with pytest.raises(BaselineError, match="two tests map to the same baseline file"):
        s.queue(_pending(s, "t.py::test_a[x_y]", 1.0))


def test_a_store_reads_only_its_machines_folder_and_names_the_others(tmp_path: Path) -> None:
    """Two machines' files side by side: each store sees only its own, and says which other machines have
    baselines (named from their files' fingerprints)."""
    there = {"hardware": "Intel(R) Xeon(R) Processor", "device": "cpu", "device_count": 4}
    mine, theirs = BaselineStore(tmp_path, "cpu", HERE, mode="all", keep=5), BaselineStore(
        tmp_path, "cpu", there, mode="all", keep=5)
    theirs.queue(_pending(theirs, "t.py::test_a", 1.0, there))
    theirs.flush()
    assert mine.all_files() == [] and mine.read("t.py::test_a", "c") == (mine.path("t.py::test_a"), None)
    hw = mine.machines()
    assert hw.without_own and hw.this.key == "amd-epyc-2cpu" and hw.this.name == "AMD EPYC, 2 CPUs"
    assert [(m.key, m.name, m.files) for m in hw.others] == [
        ("intel-xeon-4cpu", "Intel(R) Xeon(R) Processor, 4 CPUs", 1)]
    assert not theirs.machines().without_own and theirs.machines().others == ()


def test_files_without_a_hardware_folder_are_an_error_naming_the_move(tmp_path: Path) -> None:
    """A file of the layout before baselines were kept per machine is never read as any machine's: reading
    names the folder and the command that moves it."""
    (tmp_path / "cpu" / "suites.test_methods").mkdir(parents=True)
    (tmp_path / "cpu" / "suites.test_methods" / "test_a.json").write_text("{}")
    s = BaselineStore(tmp_path, "cpu", HERE, mode=None, keep=5)
    with pytest.raises(BaselineError, match=re.escape(
            "cpu/suites.test_methods holds baseline files with no hardware folder (1 such folder(s) under "
            f"{tmp_path / 'cpu'}); move them into their machine's folder, keeping their nights, with "
            f"`python -m scripts.hardware_layout {tmp_path}` from the root of a checkout of pytest-specdec")):
        s.read("suites/test_methods.py::test_a", "c")
    assert s.machines().others == ()


def test_an_unused_baseline_file_gets_one_reason_in_the_terminal_and_the_report(tmp_path: Path) -> None:
    """A file of the session's modules that no test read: deselected, stopped before its verdict (an interrupted
    session on an H200 listed its running test's file so) or gone. The terminal and the report give one reason."""
    from pytest_specdec.gate.store import UNUSED_REASON, BaselineWrites, WriteSummary
    from pytest_specdec.output.report import update_view

    path = tmp_path / "baselines" / "m" / "test_a.json"
    assert WriteSummary(unused=[path]).lines(tmp_path)[1:] == [f"  unused    baselines/m/test_a.json ({UNUSED_REASON})"]
    view = update_view(BaselineWrites(root="baselines", mode="all", unused=("baselines/m/test_a.json",)))
    assert view is not None and ("unused", "baselines/m/test_a.json", UNUSED_REASON) in view["rows"]
    assert "read it" in UNUSED_REASON and "if the test is gone" in UNUSED_REASON
