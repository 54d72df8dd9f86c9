"""Results files as a calibration's sessions: the typed results of several sessions of one machine and profile in,
the calibration record (`gate.calibration.calibrate`) out. Shared by `pytest-specdec calibrate` and the session's
end under --specdec-calibrate, so both refuse the same mixes and read the same settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_specdec.gate.calibration import CalibrationError, calibrate

if TYPE_CHECKING:
    from pytest_specdec.output.schema import Results


def of_results(named: Sequence[tuple[str, Results]], state_tolerance: float | None = None
               ) -> tuple[dict[str, Any], str, str]:
    """The record of several sessions' results files (``(name, results)``, each a night), with where it was made:
    (record, profile, hardware key). Files of two machines or profiles are refused, naming each; so is one that
    names neither (it judged against no baselines). The alpha and floor are the last session's."""
    keys = {(r.profile, machine_of(r)) for _, r in named}
    if len(keys) > 1:
        listed = "; ".join(f"{name}: profile {r.profile!r}, hardware {machine_of(r)!r}" for name, r in named)
        raise CalibrationError(f"the sessions ran on different machines or profiles ({listed}): calibrate one "
                               "machine's sessions of one profile")
    [(profile, hardware)] = keys
    if not profile or not hardware:
        raise CalibrationError(f"{named[0][0]}: no profile or hardware recorded (gate.settings.hardware.this.key): "
                               "calibrate results of sessions that judged against baselines")
    sessions = [{t.nodeid: t.night for t in r.tests if t.night.reference} for _, r in named]
    settings = named[-1][1].gate.settings
    alpha, floor = float(settings.get("alpha", 0.05)), float(settings.get("min_night_sd") or 0.0)
    record = calibrate(sessions, alpha=alpha, min_night_sd=floor, state_tolerance=state_tolerance)
    return record, profile, hardware


def machine_of(results: Results) -> str | None:
    """The machine folder a session's baselines were read from (`gate.settings.hardware.this.key`)."""
    return (results.gate.settings.get("hardware") or {}).get("this", {}).get("key")
