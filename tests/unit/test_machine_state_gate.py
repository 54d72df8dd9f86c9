"""The machine's state and identity: which stored nights a ratio metric is judged against, and how two hosts of
one model name are told apart (gate/machine.py, gate/baselines.py, servers/hardware.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from factories import PER_POS, night_entry, run_entry

from pytest_specdec.gate.baselines import hardware_key, identity_differences
from pytest_specdec.gate.machine import MACHINE_STATE, state_comparable, state_condition, state_distance
from pytest_specdec.gate.nights import Night
from pytest_specdec.gate.stats import DEFAULT_THRESHOLDS
from pytest_specdec.gate.verdicts import evaluate
from pytest_specdec.measure.probe import MachineState, mean_state
from pytest_specdec.servers.hardware import cpu_identity

QUIET = {"cores": 1.97, "hash": 2.02}
BUSY = {"cores": 1.2, "hash": 2.0}


def _night(speedup: float, state: dict[str, float] | None, started: str = "s") -> dict[str, Any]:
    """A stored night of 4 pairs at ``speedup`` (±1 %) in ``state``: the reference's E2E P95 20 % above the spec's."""
    def run(i: int, tok_s: float, spec: bool) -> dict[str, Any]:
        return run_entry(i, tok_s, per_pos=PER_POS if spec else None,
                         hd_p95_ms={"tpot": 5.0, "ttft": 20.0, "e2e": 100.0 * (1.0 if spec else 1.2) + i})
    ref = [run(i, 100.0 + i, False) for i in range(4)]
    spec = [run(i, (100.0 + i) * speedup * (1 + 0.01 * (-1) ** i), True) for i in range(4)]
    return night_entry(ref, spec, started=started, machine_state=state)


def _verdicts(baseline: list[dict[str, Any]], now: dict[str, Any], tolerance: float | None = 15.0) -> dict[str, Any]:
    return {v.metric: v for v in evaluate({"sessions": baseline}, Night.from_entry(now), thresholds=DEFAULT_THRESHOLDS,
                                          alpha=0.05, state_tolerance=tolerance)}


def test_the_distance_is_the_largest_log_ratio_over_the_figures() -> None:
    assert state_distance(QUIET, QUIET) == 0
    assert state_distance({"cores": 2.0, "hash": 2.0}, {"cores": 1.0, "hash": 2.2}) == pytest.approx(0.6931, abs=1e-4)
    assert state_comparable(QUIET, {"cores": 1.8, "hash": 2.02}, 15.0)
    assert not state_comparable(QUIET, BUSY, 15.0)


def test_a_night_probed_on_one_side_only_is_of_an_unknown_state() -> None:
    assert state_comparable(None, None, 15.0)  # endpoints elsewhere on both nights
    assert not state_comparable(QUIET, None, 15.0)
    assert not state_comparable(None, QUIET, 15.0)
    cond = state_condition([_night(1.3, QUIET), _night(1.3, None), _night(1.3, BUSY)], QUIET, 15.0)
    assert cond.kept == (0,) and cond.reason == ""


def test_a_ratio_metric_without_a_night_in_tonights_state_is_not_comparable_and_acceptance_is_judged() -> None:
    """Quiet nights at speedup 1.0, a busy night at 1.5: without the condition a confident `improved`; with it,
    `not-comparable` for the speedup and the E2E ratio, naming both states, and acceptance judged as ever."""
    stored = [_night(1.0, QUIET, "a"), _night(1.0, QUIET, "b")]
    busy = _night(1.5, BUSY)
    assert _verdicts(stored, busy, tolerance=None)["speedup"].verdict == "improved"
    got = _verdicts(stored, busy)
    for metric in ("speedup", "e2e_p95_ratio"):
        v = got[metric]
        assert (v.verdict, v.method, v.p, v.delta) == ("not-comparable", MACHINE_STATE, None, None)
        assert v.note == ("machine state: tonight cores 1.2, hash 2 GB/CPU-s; the stored nights cores 1.97, "
                          "hash 2.02 GB/CPU-s; tolerance ±15 %")
    assert (got["speedup"].now == pytest.approx(1.5, rel=0.01)
            and got["speedup"].baseline == pytest.approx(1.0, rel=0.01))
    assert got["acceptance_rate"].verdict == got["acceptance_length"].verdict == "unchanged"
    # spec tok/s with the machine factor divided out is the speedup again: not judged either
    assert got["output_tok_s"].method == got["tpot_p95_ms"].method == MACHINE_STATE


def test_the_ratio_metrics_are_judged_against_the_nights_of_tonights_state_only() -> None:
    """A file holding quiet and busy nights judges a busy night against the busy ones: a real -30 % there is
    `regressed`, while against every night pooled it would hide in the spread the two states make."""
    stored = [_night(1.0, QUIET, "q1"), _night(1.0, QUIET, "q2"), _night(1.5, BUSY, "b1"), _night(1.5, BUSY, "b2")]
    got = _verdicts(stored, _night(1.05, BUSY))
    assert got["speedup"].verdict == "regressed"
    assert "against the 2 of 4 stored nights of a comparable machine state" in got["speedup"].note
    assert _verdicts(stored, _night(1.5, BUSY))["speedup"].verdict == "unchanged"


def test_a_state_is_the_geometric_mean_of_the_tests_probes() -> None:
    got = mean_state([MachineState(2.0, 2.0), MachineState(0.5, 2.0)])
    assert got == MachineState(1.0, 2.0)
    assert mean_state([]) is None


def test_a_stored_state_that_is_not_a_positive_figure_is_an_error_naming_it(tmp_path: Path) -> None:
    from pytest_specdec.formats import BASELINE_SCHEMA
    from pytest_specdec.gate.baselines import BaselineError, load, render

    bad = copy.deepcopy(_night(1.0, {"cores": "fast", "hash": 2.0}))
    path = tmp_path / "t.json"
    path.write_text(render({"schema": BASELINE_SCHEMA, "comparability": {}, "under_test": {}, "sessions": [bad]}))
    with pytest.raises(BaselineError, match=r"sessions\[0\]\.machine_state\.cores is 'fast', not a positive number"):
        load(path, "pytest --update-baselines")


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: {family}
model\t\t: {model}
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0x1000065
flags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni sha_ni

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 99
"""


def _identity(tmp_path: Path, family: int, model: int, l2: str) -> dict[str, Any]:
    info = tmp_path / f"cpuinfo-{family}-{model}-{l2}"
    info.write_text(CPUINFO.format(family=family, model=model))
    caches = tmp_path / f"cache-{family}-{model}-{l2}"
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", l2),
                                             (3, "Unified", "32768K")]):
        (caches / f"index{i}").mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (caches / f"index{i}" / name).write_text(f"{value}\n")
    return cpu_identity(info, caches)


def test_two_hosts_of_one_model_name_get_two_folders_and_their_differences_are_named(tmp_path: Path) -> None:
    zen4 = _identity(tmp_path, 25, 17, "1024K")
    zen5 = _identity(tmp_path, 26, 2, "2048K")
    assert zen4["vendor"] == "AuthenticAMD" and zen4["family"] == "25" and zen4["microcode"] == "0x1000065"
    assert zen4["caches"] == {"l1d": "48K", "l1i": "32K", "l2": "1024K", "l3": "32768K"}
    assert zen4["isa"] == ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]
    here = {"hardware": "AMD EPYC", "device": "cpu", "device_count": 2}
    a, b = hardware_key({**here, "identity": zen4}), hardware_key({**here, "identity": zen5})
    assert a.startswith("amd-epyc-2cpu-") and b.startswith("amd-epyc-2cpu-") and a != b
    assert a == hardware_key({**here, "identity": copy.deepcopy(zen4)})  # stable
    assert identity_differences(zen5, zen4) == ["caches.l2 1024K → 2048K", "family 25 → 26", "model 17 → 2"]
    assert identity_differences({**zen4, "isa": ["avx2"]}, zen4) == [
        "isa avx2, avx512f, avx512_bf16, avx512_vnni → avx2"]
    assert identity_differences(zen5, None) == ["recorded without a machine identity (before the plugin kept one)"]


def test_a_gpu_identity_holds_each_gpus_limits_and_a_lowered_power_limit_is_another_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from pytest_specdec.servers.hardware import gpu_identity

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    monkeypatch.setenv("SPECDEC_NVIDIA_SMI", str(smi))
    asked: list[list[str]] = []

    def answer(watts: str) -> Any:
        def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
            asked.append(cmd)
            return subprocess.CompletedProcess(cmd, 0, f"NVIDIA H200, 143771 MiB, {watts} W, 1980 MHz, 3201 MHz\n" * 2)
        return run

    full = gpu_identity(answer("700.00"))
    assert asked[0][1:] == ["--query-gpu=name,memory.total,power.limit,clocks.max.sm,clocks.max.memory",
                            "--format=csv,noheader"]
    assert full["gpus"] == [{"name": "NVIDIA H200", "memory.total": "143771 MiB", "power.limit": "700.00 W",
                             "clocks.max.sm": "1980 MHz", "clocks.max.memory": "3201 MHz"}] * 2
    assert full["host"] == cpu_identity()  # the host-bound part of a step runs there
    capped = gpu_identity(answer("450.00"))
    here = {"hardware": "H200", "device": "cuda", "device_count": 2}
    assert hardware_key({**here, "identity": full}) != hardware_key({**here, "identity": capped})
    assert identity_differences(capped, full) == ["gpus.0.power.limit 700.00 W → 450.00 W",
                                                  "gpus.1.power.limit 700.00 W → 450.00 W"]
    # a row without every field (a name with a comma, a driver that leaves one out) is said, never half-read
    short = gpu_identity(lambda cmd, **_: subprocess.CompletedProcess(cmd, 0, "NVIDIA H200, 143771 MiB, 700.00 W\n"))
    assert short["gpus"] == ("--query-gpu=name,memory.total,power.limit,clocks.max.sm,clocks.max.memory "
                             "--format=csv,noheader printed a row of 3 fields, not 5: NVIDIA H200, 143771 MiB, "
                             "700.00 W")
