"""Stored baselines: where they live, what they hold, how they are read, and how they are written.

One JSON file per test: ``<root>/<profile>/<hardware>/<suite module>/<test id>.json``. ``<hardware>`` is a
short, stable name of the machine the nights were measured on (`hardware_key`: ``amd-epyc-7763-64-core-4cpu``),
so machines of one profile keep their nights side by side and a session reads and writes only its own
machine's folder; the full fingerprint is the file's ``comparability``. It holds

* ``comparability`` — what must be equal for a comparison to mean anything (hardware, target model and
  its hash, dataset and its hash, workload, sampling, server args that shape the workload, the
  speculation knobs). A mismatch gives ``not-comparable`` with the differing fields;
* ``under_test`` — what the gate exists to judge (vLLM/torch/CUDA/driver versions, the draft/head hash,
  the plugin version, the resolved engine config): diffed and shown, never blocking;
* ``sessions`` — raw per-run values grouped by measurement session (one server start each), the last
  ``keep`` of them, so the file learns the night-to-night variance.

Each session is a `gate.nights.Night` entry (`night_entry`), each run a `measure.record.ArmRun` entry
(`arm_run_entry`): the one run record, whose names are the metric registry's; both written here, beside their reader
(`read`). A sweep's crossover record keeps each night's crossover as `crossover_value_entry` writes it. Files are
deterministic and diff-friendly: sorted keys, one value per line, floats rounded to 6 significant digits, a schema
version. A file of an older schema is an error naming the command that converts it
(``pytest-specdec convert-schema``); nothing reinterprets it silently. Nothing is written unless
``--update-baselines`` asks for it (`store.py`: the queue and the writes at the session's end).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecError, field_problem, json_object
from pytest_specdec.formats import BASELINE_SCHEMA, SWEEP_SCHEMA, FileFormat

if TYPE_CHECKING:
    from pytest_specdec.gate.crossover import Crossover
    from pytest_specdec.gate.nights import Night
    from pytest_specdec.measure.record import ArmRun

SIGNIFICANT = 6


class BaselineError(SpecDecError):
    """A baseline file that cannot be used as it is; the message names the file and the fix."""


class OlderBaseline(BaselineError):
    """A baseline file of an older schema: converted by `CONVERT`, never replaced (its nights may not be
    measurable again)."""


# ---- paths --------------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._\-\[\]=+,@]")


def safe_part(part: str) -> str:
    """One path component of a baseline file from a profile or test name: any character a file system
    or a shell could trip on becomes `_`."""
    return _UNSAFE.sub("_", part) or "_"


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """``suites/test_methods.py::test_methods[ngram-k3]`` → (``suites.test_methods``, ``test_methods[ngram-k3]``)."""
    path, _, rest = nodeid.partition("::")
    module = path[:-3] if path.endswith(".py") else path
    module = ".".join(safe_part(p) for p in module.replace("\\", "/").split("/") if p not in ("", "."))
    return module or "_", safe_part(rest.replace("::", ".")) if rest else "_"


def baseline_path(root: Path, profile: str, hardware: str, nodeid: str) -> Path:
    """Where the baseline of ``nodeid`` lives under ``root`` for ``profile`` measured on ``hardware`` (a
    `hardware_key`)."""
    module, test = split_nodeid(nodeid)
    return root / safe_part(profile) / safe_part(hardware) / module / f"{test}.json"


#: What a CPU's or GPU's marketing name carries that says nothing about the machine.
_NOISE = re.compile(r"\((?:r|tm|c)\)|\b(?:cpu|processor)\b|@", re.IGNORECASE)


def hardware_key(fingerprint: Mapping[str, Any]) -> str:
    """The folder name of one machine's baselines, from the machine's part of a comparability record
    (``hardware``, ``device``, ``device_count``, ``identity``): the model name in lower case without trademark
    signs and the words CPU/Processor, then how many CPUs or GPUs, then six hex digits of the identity
    (``Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz`` with 4 CPUs → ``intel-xeon-platinum-8370c-2.80ghz-4cpu-3fa2c1``).
    Stable: the same machine gets the same name on every run, and readable in a path and a cache key."""
    name = _NOISE.sub(" ", str(fingerprint.get("hardware") or "unknown"))
    slug = re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-.") or "unknown"
    count = fingerprint.get("device_count")
    unit = "cpu" if fingerprint.get("device", "cpu") == "cpu" else "gpu"
    key = f"{slug[:60].rstrip('-.')}-{count}{unit}" if count else slug[:60]
    identity = fingerprint.get("identity")
    return f"{key}-{identity_hash(identity)}" if identity is not None else key


def identity_hash(identity: Any) -> str:
    """Six hex digits of a machine identity's canonical JSON: the part of a folder name that tells two hosts
    of one model name apart (the identity itself is in every file's comparability, for the words)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:6]


def identity_differences(ours: Any, theirs: Any) -> list[str]:
    """How another machine's identity differs from this one's, field by field (``family 25 → 26``), for the
    block a machine without baselines of its own says; a folder recorded without one says so."""
    if theirs is None:
        return ["recorded without a machine identity (before the plugin kept one)"]
    def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
        """Dotted keys down to scalars, a list of records by index (``gpus.0.power.limit``), a list of flags as one
        value (``isa avx2, avx512f``)."""
        if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
            return {prefix: ", ".join(map(str, value)) or "none"}
        if isinstance(value, list):
            value = {str(i): v for i, v in enumerate(value)}
        if isinstance(value, dict) and value:
            return {k: v for key, item in value.items() for k, v in leaves(item, f"{prefix}.{key}" if prefix
                                                                            else str(key)).items()}
        return {prefix: value}

    a, b = leaves(theirs), leaves(ours)
    return [f"{k} {a.get(k, '—')} → {b.get(k, '—')}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def hardware_label(fingerprint: Mapping[str, Any]) -> str:
    """How the words name one machine: its model and how many CPUs or GPUs (``AMD EPYC, 2 CPUs``)."""
    count = fingerprint.get("device_count")
    unit = "CPU" if fingerprint.get("device", "cpu") == "cpu" else "GPU"
    return f"{fingerprint.get('hardware') or 'unknown'}" + (f", {count} {unit}s" if count else "")


# ---- identities ---------------------------------------------------------------------------------

_hash_cache: dict[str, dict[str, Any]] = {}


def portable(value: Any) -> Any:
    """The zoo's model paths written `zoo:NAME` again: where a checkout lives is no change under test
    (the models' identity is in `draft` and the comparability's `target`, by sha256)."""
    from pytest_specdec.zoo import MODELS_DIR

    prefix = f"{MODELS_DIR}/"
    if isinstance(value, str) and value.startswith(prefix):
        return "zoo:" + value[len(prefix):]
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    return value


def model_identity(name: str, revision: str | None = None) -> dict[str, Any]:
    """A model as a comparability/under-test value: content hash for local paths, id + revision for hub names.

    A zoo directory is hashed from the zoo's MANIFEST.json; another local directory from its files
    (configs, tokenizer, weights); a hub name is taken as given, with its revision (None = unpinned).
    """
    if name in _hash_cache:
        return _hash_cache[name]
    path = Path(name)
    if not path.exists():
        out: dict[str, Any] = {"id": name, "revision": revision}
    else:
        from pytest_specdec.zoo import MODELS_DIR, manifest, sha256_file

        h = hashlib.sha256()
        resolved = path.resolve()
        if resolved.is_dir() and resolved.parent == MODELS_DIR:
            files = manifest()["files"]
            for rel in sorted(f for f in files if f.startswith(resolved.name + "/")):
                h.update(f"{rel.split('/', 1)[1]}\0{files[rel]['sha256']}\n".encode())
        elif resolved.is_dir():
            for f in sorted(p for p in resolved.rglob("*") if p.is_file() and not p.name.startswith(".")):
                h.update(f"{f.relative_to(resolved).as_posix()}\0{sha256_file(f)}\n".encode())
        else:
            h.update(sha256_file(resolved).encode())
        out = {"id": path.name, "sha256": h.hexdigest()}
    _hash_cache[name] = out
    return out


# ---- values -------------------------------------------------------------------------------------


def rounded(value: Any) -> Any:
    """Floats to SIGNIFICANT digits (recursively); NaN/inf refused (nothing unreadable is stored)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BaselineError(f"refusing to store the non-finite value {value!r} in a baseline")
        return float(f"{value:.{SIGNIFICANT}g}")
    if isinstance(value, dict):
        return {str(k): rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def render(data: dict[str, Any]) -> str:
    """The file text: sorted keys, one value per line, rounded floats, trailing newline."""
    return json.dumps(rounded(data), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


class StoredNight(dict[str, Any]):
    """One ``sessions`` entry of a baseline file as `load` read it: the entry itself (a dict, so it is merged,
    written back and diffed as the file holds it) with its typed night, read once with the file. The gate
    reads a stored night several times a test (priors, night variances, the machine factor, the verdicts, the
    split): each reads this one, not a conversion of its own. Read-only: the night would not follow an edit."""

    __slots__ = ("night",)

    def __init__(self, entry: Mapping[str, Any], night: Night) -> None:
        super().__init__(entry)
        self.night = night


def night_of(entry: Mapping[str, Any]) -> Night:
    """The typed night of a stored session entry: the one `load` read, or read now from a baseline held only in
    memory (`compare`'s, built from a results file)."""
    from pytest_specdec.gate.nights import Night

    return entry.night if isinstance(entry, StoredNight) else Night.from_entry(entry)


def metric_values(entry: Mapping[str, Any]) -> dict[str, list[float]]:
    """Per-run values of every verdict metric in one stored session entry (`gate.nights.Night`: the one
    definition, for stored nights and tonight alike)."""
    return night_of(entry).metric_values()


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts → dotted keys (lists and scalars are leaves)."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k in sorted(data):
            out.update(flatten(data[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``dotted key: (old, new)`` for every leaf that differs (missing on one side is None)."""
    a, b = flatten(rounded(old)), flatten(rounded(new))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def relative(path: Path, root: Path) -> str:
    """A baseline path as the user's checkout names it (absolute when it lies outside `root`)."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ---- reading ------------------------------------------------------------------------------------


def load(path: Path, create_hint: str) -> dict[str, Any] | None:
    """The parsed, validated baseline at ``path``, each session a `StoredNight` (its night read once, here);
    None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    fix = f"fix or delete it, then recreate it with `{create_hint}`"
    try:
        data = json_object(text)
    except ValueError as exc:
        raise BaselineError(f"baseline {path} is not valid JSON ({exc}); {fix}") from None
    except TypeError:
        raise BaselineError(f"baseline {path} is not a JSON object; {fix}") from None
    return read(data, str(path), fix)


def read(data: dict[str, Any], name: str, fix: str = "fix or delete it") -> dict[str, Any]:
    """A parsed baseline file checked and typed: each session a `StoredNight`. ``name`` (its path) and ``fix`` are
    what an error says; an older schema is `OlderBaseline`, naming the command that converts it."""
    from pytest_specdec.gate.nights import NIGHT_FIELDS, Night, pairs_problem
    from pytest_specdec.measure.probe import state_problem
    from pytest_specdec.measure.record import runs_problem

    if wrong := BASELINE_FILE.version_problem(data, name):
        said, older = wrong
        raise OlderBaseline(said) if older else BaselineError(f"{said}; {fix}")
    for key, kind in (("comparability", dict), ("under_test", dict), ("sessions", list)):
        if not isinstance(data.get(key), kind):
            raise BaselineError(f"baseline {name}: '{key}' is missing or not a {kind.__name__}; {fix}")
    for i, s in enumerate(data["sessions"]):
        ok = (isinstance(s, dict) and isinstance(s.get("runs"), dict)
              and all(isinstance(s["runs"].get(a), list) for a in ("reference", "spec")))
        if not ok:
            raise BaselineError(f"baseline {name}: sessions[{i}] has no runs.reference/runs.spec lists; {fix}")
        problem = (field_problem(s, NIGHT_FIELDS) or pairs_problem(s["speedup_per_pair"])
                   or (f".machine_state{p}" if (p := state_problem(s.get("machine_state"))) else ""))
        if problem:
            raise BaselineError(f"baseline {name}: sessions[{i}]{problem}; {fix}")
        for arm in ("reference", "spec"):
            problem = runs_problem(s["runs"][arm])
            if problem:
                raise BaselineError(f"baseline {name}: sessions[{i}].runs.{arm}{problem}; {fix}")
    data["sessions"] = [StoredNight(s, Night.from_entry(s)) for s in data["sessions"]]
    return data


# ---- writing: each file, a night and its runs as a file stores them ----------------------------------------


def baseline_text(nodeid: str, profile: str, comparability: Mapping[str, Any], under_test: Mapping[str, Any],
                  sessions: Sequence[Mapping[str, Any]]) -> str:
    """A baseline file's text: its schema, the test and profile, the conditions its nights are comparable under,
    what was under test, and the nights kept (`night_entry`), oldest first (`read` reads it back)."""
    return BASELINE_FILE.render({"schema": BASELINE_FILE.version, "nodeid": nodeid, "profile": profile,
                                 "comparability": comparability, "under_test": under_test,
                                 "sessions": list(sessions)})


def crossover_text(record: Mapping[str, Any], nights: Sequence[Mapping[str, Any]]) -> str:
    """A crossover record's text: its sweep (`sweep_entry`) and the nights kept (`sweep_night_entry`), oldest first
    (`read_sweep` reads it back)."""
    return CROSSOVER_FILE.render({**record, "schema": CROSSOVER_FILE.version, "nights": list(nights)})


def sweep_entry(sweep: str, profile: str, tests: Sequence[str], axis: str) -> dict[str, Any]:
    """What a crossover record is of: the sweep's id, the profile, its tests and the axis swept."""
    return {"sweep": sweep, "profile": profile, "tests": list(tests), "axis": axis}


def sweep_night_entry(started: str, axis: str, grid: Iterable[tuple[float, Sequence[float]]], crossover: Crossover,
                      machine_state: Mapping[str, float] | None, saturation: float | None) -> dict[str, Any]:
    """One night of a crossover record: when it started, each point's speedups, its crossover statistic
    (`crossover_value_entry`), the machine's state while it ran and a rate sweep's saturation (where there are)."""
    return {"started": started, "points": [{axis: at, "speedups": list(v)} for at, v in grid],
            "crossover": crossover_value_entry(crossover),
            **({"machine_state": dict(machine_state)} if machine_state is not None else {}),
            **({"saturation_req_s": saturation} if saturation is not None else {})}


def night_entry(night: Night) -> dict[str, Any]:
    """A night as a baseline file stores it in `sessions` (`read` checks it, `gate.nights.Night.from_entry` reads it
    back): every run, invalid ones too (flagged)."""
    return {
        "started": night.started, "under_test": dict(night.under_test),
        "runs": {"reference": [arm_run_entry(r) for r in night.reference],
                 "spec": [arm_run_entry(r) for r in night.spec]},
        "speedup_per_pair": list(night.speedup_per_pair),
        **({"machine_state": dict(night.machine_state)} if night.machine_state is not None else {}),
    }


def arm_run_entry(r: ArmRun) -> dict[str, Any]:
    """A run as a baseline night stores it: every `measure.record.RUN_FIELDS` key (`measure.record.run_problem`
    checks it, `ArmRun.from_entry` reads it back)."""
    return {
        "index": r.index, "valid": r.valid, "invalid_reasons": list(r.invalid_reasons),
        "latency_untrusted": list(r.latency_untrusted), "output_tok_s": r.output_tok_s,
        "n_requests": r.n_requests, "total_output_tokens": r.total_output_tokens, "drafts": r.drafts,
        "draft_tokens": r.draft_tokens, "accepted_tokens": r.accepted_tokens,
        "accepted_per_pos": None if r.accepted_per_pos is None else list(r.accepted_per_pos),
        "acceptance_rate": r.acceptance_rate, "draft_coverage": r.draft_coverage,
        **{name: None if v is None else dict(v) for name, v in r.latencies_ms.items()},
        "hd_p95_ms": dict(r.hd_p95_ms),
        # only where measured: a test without SLOs stores what it stored before
        **({"goodput_req_s": r.goodput_req_s} if r.goodput_req_s is not None else {}),
    }


# ---- a sweep's crossover record -------------------------------------------------------------------

#: A sweep's record beside its tests' files: its own extension, so no reader of per-test files takes it for one.
SWEEP_SUFFIX = ".crossover"


def sweep_path(root: Path, profile: str, hardware: str, sweep_id: str) -> Path:
    """Where the crossover record of a sweep lives: where a test named ``sweep_id`` would keep its file, with
    `SWEEP_SUFFIX` (so it follows wherever `baseline_path` puts the tests, one machine's folder)."""
    return baseline_path(root, profile, hardware, sweep_id).with_suffix(SWEEP_SUFFIX)


def load_sweep(path: Path) -> dict[str, Any] | None:
    """The stored crossover record at ``path`` (its nights' per-point speedups), checked; None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json_object(text)
    except (ValueError, TypeError):
        raise BaselineError(f"crossover record {path} is not a JSON object; {SWEEP_FIX}") from None
    return read_sweep(data, str(path))


#: What a crossover record that cannot be read asks of its user.
SWEEP_FIX = "fix or delete it, then recreate it with `pytest --update-baselines`"


def read_sweep(data: dict[str, Any], name: str) -> dict[str, Any]:
    """A parsed crossover record, checked (``name``, its path, is what an error says)."""
    from pytest_specdec.measure.probe import state_problem

    if wrong := CROSSOVER_FILE.version_problem(data, name):
        raise BaselineError(f"{wrong[0]}; {SWEEP_FIX}")
    nights = data.get("nights")
    if not isinstance(nights, list) or not all(isinstance(n, dict) for n in nights):
        raise BaselineError(f"crossover record {name}: 'nights' is missing or not a list of objects; {SWEEP_FIX}")
    for i, night in enumerate(nights):
        problem = state_problem(night.get("machine_state"))
        if problem:
            raise BaselineError(f"crossover record {name}: nights[{i}].machine_state{problem}; {SWEEP_FIX}")
    return data


def crossover_value_entry(c: Crossover) -> dict[str, Any]:
    """A crossover statistic (`gate.crossover.Crossover`) as a crossover record's night keeps it under `crossover`
    (its `text` is what `gate.crossover_gate.stored_night` reads back), and as the results' `crossovers` entries
    hold it (`output.results.crossover_entry`): side, value, CI, level, swept range, words, pairs per point, axis,
    and a rate sweep's figures in req/s beside the fractions it is gated on."""
    out = {"side": c.side, "value": c.value, "ci": list(c.ci) if c.ci else None,
           "level": c.level, "c_min": c.c_min, "c_max": c.c_max, "text": c.text(),
           "pairs": [{c.axis: at, "n": n} for at, n in c.pairs], "axis": c.axis}
    if c.saturation is not None:  # the stop-paying rate in req/s beside the fraction it is gated on
        sat = c.saturation
        out.update(saturation_req_s=sat, value_req_s=None if c.value is None else c.value * sat,
                   ci_req_s=[x * sat for x in c.ci] if c.ci else None)
    return out


# ---- the formats: older baseline files, step by step ---------------------------------------------

#: `config_source` of an engine config that schema 1 kept as vLLM's log line printed it.
LOG_LINE_ERA = "log line (schema 1)"


def run_record(run: dict[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    """One stored run with the run record's fields: ``renamed`` old names → new, the validity lists empty
    where absent (valid and trusted, as their absence meant), any other absent field null (not recorded),
    except `hd_p95_ms`, an empty map, and the optional ones (goodput), left absent."""
    from pytest_specdec.measure.record import OPTIONAL_RUN_FIELDS, RUN_FIELDS

    out = {renamed.get(k, k): v for k, v in run.items()}
    out.setdefault("invalid_reasons", [])
    out.setdefault("latency_untrusted", [])
    out.setdefault("hd_p95_ms", {})
    for key in [k for k in RUN_FIELDS if k not in OPTIONAL_RUN_FIELDS]:
        out.setdefault(key, None)
    return out


def _from_1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 → 2: engine configs without `config_source` were stored from vLLM's log line."""
    for config in (data["under_test"].get("engine_config") or {}).values():
        if isinstance(config, dict) and config and "config_source" not in config:
            config["config_source"] = LOG_LINE_ERA
    return data


def _from_2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 → 3: every run is a full run record under the registry's names; a session without
    `under_test` or `speedup_per_pair` records none."""
    for session in data["sessions"]:
        session.setdefault("under_test", {})
        session.setdefault("speedup_per_pair", [])
        session.setdefault("started", "")
        runs = session["runs"]
        for arm in ("reference", "spec"):
            runs[arm] = [run_record(r, {"itl_ms": "itl_token_ms"}) for r in runs[arm]]
    return data


def _counts(data: Mapping[str, Any]) -> tuple[int, int]:
    """(sessions, runs) of a baseline file."""
    sessions = data["sessions"]
    return len(sessions), sum(len(s["runs"][arm]) for s in sessions for arm in ("reference", "spec"))


#: A test's baseline file.
BASELINE_FILE = FileFormat(kind="baseline", version=BASELINE_SCHEMA, detect=lambda d: "sessions" in d,
                           render=render, read=read, counts=_counts, steps={1: _from_1, 2: _from_2})
#: A concurrency sweep's crossover record (one version so far: `convert-schema` finds it current).
CROSSOVER_FILE = FileFormat(kind="crossover record", version=SWEEP_SCHEMA, detect=lambda d: "nights" in d,
                            render=render, read=read_sweep, counts=lambda d: (len(d["nights"]), 0),
                            counted="nights", suffix=SWEEP_SUFFIX)
