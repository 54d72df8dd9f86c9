"""The machine's state: a short fixed probe that does not touch vLLM, run before and after each test's runs.

Why: on a small CPU host the speedup itself moves with the machine's speed (the draft's per-step overhead
does not scale like the target's step), so a verdict on a ratio metric holds only against nights recorded in
a comparable state. The reference arm's speed cannot tell "the machine is slower" from "vLLM's reference path
is slower"; this probe can, since no vLLM code is in it. Two figures:

- ``cores``: the CPU time one busy thread per usable CPU gets in a 0.15 s window, over the window (2.0 on an
  idle 2-CPU machine, ~1.0 to 1.5 with another process spinning: the share of the machine a run gets);
- ``hash``: SHA-256 GB per CPU-second of those threads (the per-core speed: host type, clock, not contention);

CPU seconds, not wall seconds, for the speed: a core shared with another process is time-sliced, and that is
what ``cores`` measures, once. An interpreter loop's speed was tried as a third figure and dropped: it differed
by 20 % between two Python processes on one idle machine. About 0.15 s in all; repeats on an idle machine
agree within a few % (docs/validation.md). ``SPECDEC_MACHINE_PROBE`` names an executable to run instead, which prints
one JSON
object with the same keys (the tests give a simulated machine's state this way). No pytest.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_specdec.errors import ConfigError

#: Path of an executable that prints the state as JSON instead of the built-in probe (tests, other hardware).
PROBE_ENV = "SPECDEC_MACHINE_PROBE"
#: The probe's figures and their units, in the order the words give them.
COMPONENTS: dict[str, str] = {"cores": "cores", "hash": "GB/CPU-s"}


@dataclass(frozen=True)
class MachineState:
    """One probe's figures (each higher on a faster or less busy machine)."""

    cores: float
    hash: float

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "machine state") -> MachineState:
        """A stored or printed state (as `state_entry` writes it); a missing or non-positive figure is an error naming
        it (`state_problem`)."""
        problem = state_problem(d)
        if problem:
            raise ConfigError(f"{where}{problem} (figures as `python -m pytest_specdec.measure.probe` prints them)")
        figures = {name: _figure(d[name]) for name in COMPONENTS}
        return cls(cores=figures["cores"], hash=figures["hash"])


def _figure(value: object) -> float:
    """A figure `state_problem` found a number, as a float."""
    if not isinstance(value, (int, float)):
        raise TypeError(f"a machine state's figure is {value!r}: state_problem lets no such figure through")
    return float(value)


def state_entry(state: MachineState) -> dict[str, float]:
    """A state's figures as every file and the probe command keep them, rounded to 4 decimals: a baseline night's
    and a crossover record's ``machine_state``, a results test's ``machine_state`` and its ``probes``, and the
    one JSON object ``python -m pytest_specdec.measure.probe`` prints. One writer below the gate, beside the one
    check all of their readers go through (`state_problem`) and `MachineState.from_dict`, so each format can take
    it; the gate also holds tonight's state as these figures (`gate.nights.Night.machine_state`)."""
    return {name: round(getattr(state, name), 4) for name in COMPONENTS}


def state_problem(state: object) -> str:
    """What is wrong with a machine state as stored or printed ("" when nothing, or when there is none), worded to
    follow its path: every figure of the probe a positive number. A record may hold more (a results file's probes).
    The one check of a state: the baselines, results files, crossover records and the probe command read through it."""
    if state is None:
        return ""
    if not isinstance(state, Mapping):
        return f" is {state!r}, not dict"
    for name in COMPONENTS:
        v = state.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return f".{name} is {v!r}, not a positive number"
    return ""


def _threads(n: int, window_s: float) -> tuple[float, float]:
    """``n`` threads hashing for ``window_s`` each (hashlib releases the GIL on large buffers): the CPU time
    they got over the wall time (cores), and GB hashed per CPU-second."""
    data = b"\0" * (1 << 20)
    got: list[tuple[int, float, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(n + 1)

    def work() -> None:
        start.wait()
        c0, t0, done = time.thread_time(), time.perf_counter(), 0
        while time.perf_counter() - t0 < window_s:
            hashlib.sha256(data)
            done += len(data)
        with lock:
            got.append((done, time.thread_time() - c0, time.perf_counter() - t0))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join()
    cpu = sum(c for _, c, _ in got)
    return sum(c / w for _, c, w in got), sum(d for d, _, _ in got) / max(cpu, 1e-9) / 1e9


def builtin_probe(window_s: float = 0.15) -> MachineState:
    """The built-in probe on this machine: ``window_s`` of every CPU this process may use."""
    return MachineState(*_threads(len(os.sched_getaffinity(0)), window_s))


def command_probe(path: str) -> MachineState:
    """The state as the executable ``path`` prints it (one JSON object)."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ConfigError(f"{PROBE_ENV}={path!r} is not an executable file; unset it to use the built-in probe")
    try:
        done = subprocess.run([path], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"{PROBE_ENV}={path!r} could not run: {exc}") from exc
    if done.returncode != 0:
        raise ConfigError(f"{PROBE_ENV}={path!r} exited with {done.returncode}: {done.stderr.strip()[-300:]}")
    try:
        data = json.loads(done.stdout)
    except ValueError as exc:
        raise ConfigError(f"{PROBE_ENV}={path!r} printed {done.stdout[:200]!r}, not one JSON object") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{PROBE_ENV}={path!r} printed {data!r}, not one JSON object")
    return MachineState.from_dict(data, f"{PROBE_ENV}={path!r}")


def probe() -> MachineState:
    """This machine's state now: ``SPECDEC_MACHINE_PROBE``'s when set, else the built-in probe's."""
    path = os.environ.get(PROBE_ENV)
    return command_probe(path) if path else builtin_probe()


def mean_state(states: list[MachineState]) -> MachineState | None:
    """The geometric mean of several probes (before and after a test's runs), per figure."""
    if not states:
        return None
    from pytest_specdec.measure.figures import mean_log

    return MachineState(**{name: math.exp(mean_log(getattr(s, name) for s in states)) for name in COMPONENTS})


if __name__ == "__main__":
    print(json.dumps(state_entry(probe())))
