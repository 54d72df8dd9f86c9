"""Stored baselines: where they live, what they hold, how they are read, and how they are written.

One JSON file per test: ``<root>/<profile>/<suite module>/<test id>.json``. It holds

* ``comparability`` — what must be equal for a comparison to mean anything (hardware, target model and
  its hash, dataset and its hash, workload, sampling, server args that shape the workload, the
  speculation knobs). A mismatch gives ``not-comparable`` with the differing fields;
* ``under_test`` — what the gate exists to judge (vLLM/torch/CUDA/driver versions, the draft/head hash,
  the plugin version, the resolved engine config): diffed and shown, never blocking;
* ``sessions`` — raw per-run values grouped by measurement session (one server start each), the last
  ``keep`` of them, so the file learns the night-to-night variance.

Files are deterministic and diff-friendly: sorted keys, one value per line, floats rounded to 6
significant digits, a schema version (older ones read through `upgrade`). Nothing is written unless
``--update-baselines`` asks for it (`store.py`: the queue and the writes at the session's end).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import SpecDecError, field_problem, json_object

if TYPE_CHECKING:
    from pytest_specdec.measure.runner import CaseResult, RunRecord

SCHEMA = 2
#: `config_source` of an engine config that schema 1 kept as vLLM's log line printed it (strings, no
#: `config_source`), before it came from /server_info.
LOG_LINE_ERA = "log line (schema 1)"
SIGNIFICANT = 6


class BaselineError(SpecDecError):
    """A baseline file that cannot be used as it is; the message names the file and the fix."""


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


def baseline_path(root: Path, profile: str, nodeid: str) -> Path:
    """Where the baseline of ``nodeid`` lives under ``root`` for ``profile``."""
    module, test = split_nodeid(nodeid)
    return root / safe_part(profile) / module / f"{test}.json"


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


def _run_entry(run: RunRecord) -> dict[str, Any]:
    from pytest_specdec.gate.nights import accepted_counts

    m, spec = run.metrics, run.metrics.spec

    def pct(d: dict[str, float] | None) -> dict[str, float] | None:
        return None if d is None else {k: d[k] for k in ("p50", "p95", "p99") if k in d}

    return {
        "index": run.index,
        "valid": run.valid,
        "invalid_reasons": list(run.invalid),
        "latency_untrusted": list(run.untrusted),
        "output_tok_s": m.output_tok_s,
        "n_requests": m.n_requests,
        "total_output_tokens": m.total_output_tokens,
        "drafts": spec and spec.drafts,
        "draft_tokens": spec and spec.draft_tokens,
        "accepted_tokens": spec and spec.accepted_tokens,
        "accepted_per_pos": accepted_counts(spec),
        "acceptance_rate": spec and spec.acceptance_rate,
        "draft_coverage": spec and spec.draft_coverage,
        "ttft_ms": pct(m.ttft_ms),
        "tpot_ms": pct(m.tpot_ms),
        "itl_ms": pct(m.itl_token_ms),
        "e2e_ms": pct(m.e2e_ms),
        "hd_p95_ms": dict(run.hd_p95_ms),
    }


def session_entry(result: CaseResult, started: str, under_test: dict[str, Any]) -> dict[str, Any]:
    """Tonight's measurement session as stored: every run (invalid ones too, flagged), speedup per pair."""
    return {
        "started": started,
        "under_test": under_test,
        "runs": {
            "reference": [_run_entry(r) for r in result.reference_runs],
            "spec": [_run_entry(r) for r in result.runs],
        },
        "speedup_per_pair": list(result.speedup_per_pair),
    }


def metric_values(entry: dict[str, Any]) -> dict[str, list[float]]:
    """Per-run values of every verdict metric in one stored session entry (`gate.nights.Night`: the one
    definition, for stored nights and tonight alike)."""
    from pytest_specdec.gate.nights import Night

    return Night.from_entry(entry).metric_values()


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


def _log_line_era(under_test: dict[str, Any]) -> bool:
    return any(isinstance(c, dict) and c.get("config_source") == LOG_LINE_ERA
               for c in (under_test.get("engine_config") or {}).values())


def under_test_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`diff` of two `under_test` records; an engine config stored in the old log-line format is one line
    saying so (its ~90 mangled strings would bury the real changes), not a leaf-by-leaf diff."""
    if _log_line_era(old) and not _log_line_era(new):
        def strip(d: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in d.items() if k != "engine_config"}

        out = diff(strip(old), strip(new))
        out["engine_config"] = ("(stored in the old log-line format)",
                                "(now from /server_info; --update-baselines records it)")
        return out
    return diff(old, new)


def relative(path: Path, root: Path) -> str:
    """A baseline path as the user's checkout names it (absolute when it lies outside `root`)."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ---- reading ------------------------------------------------------------------------------------


def load(path: Path, create_hint: str) -> dict[str, Any] | None:
    """The parsed, validated baseline at ``path``; None when there is none."""
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
    version = data.get("schema")
    if version not in (1, SCHEMA):
        raise BaselineError(f"baseline {path} has schema {version!r}, this plugin reads schemas 1 to "
                            f"{SCHEMA}; {fix}")
    for key, kind in (("comparability", dict), ("under_test", dict), ("sessions", list)):
        if not isinstance(data.get(key), kind):
            raise BaselineError(f"baseline {path}: '{key}' is missing or not a {kind.__name__}; {fix}")
    for i, s in enumerate(data["sessions"]):
        ok = (isinstance(s, dict) and isinstance(s.get("runs"), dict)
              and all(isinstance(s["runs"].get(a), list) for a in ("reference", "spec")))
        if not ok:
            raise BaselineError(f"baseline {path}: sessions[{i}] has no runs.reference/runs.spec lists; {fix}")
        problem = field_problem(s, _SESSION_FIELDS, required=()) or _numbers_problem(
            (f".speedup_per_pair[{n}]", v) for n, v in enumerate(s.get("speedup_per_pair") or []))
        if problem:
            raise BaselineError(f"baseline {path}: sessions[{i}]{problem}; {fix}")
        for arm in ("reference", "spec"):
            for j, run in enumerate(s["runs"][arm]):
                problem = field_problem(run, _RUN_FIELDS[arm]) or _numbers_problem(_run_numbers(run))
                if problem:
                    raise BaselineError(f"baseline {path}: sessions[{i}].runs.{arm}[{j}]{problem}; {fix}")
    return upgrade(data)


_NUMBER = (int, float, type(None))
#: What the verdicts read from a stored session besides its runs; a file written before a key existed may
#: lack it.
_SESSION_FIELDS: dict[str, tuple[type, ...]] = {"started": (str,), "speedup_per_pair": (list,)}
#: What the verdicts read from a stored run, per arm, and the types each may hold.
_RUN_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "reference": {"index": (int,), "valid": (bool,), "output_tok_s": _NUMBER, "hd_p95_ms": (dict,)},
}
_RUN_FIELDS["spec"] = {**_RUN_FIELDS["reference"], "acceptance_rate": _NUMBER, "drafts": _NUMBER,
                       "accepted_per_pos": (list, type(None)), "draft_coverage": _NUMBER}


def _run_numbers(run: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every figure of a stored run the verdicts compute with, by its path in the run: the scalars, the
    accepted tokens per position and the P95 latencies."""
    out = [(f".{key}", run[key]) for key, kinds in _RUN_FIELDS["spec"].items() if kinds is _NUMBER and key in run]
    out += [(f".accepted_per_pos[{n}]", v) for n, v in enumerate(run.get("accepted_per_pos") or [])]
    out += [(f".hd_p95_ms.{k}", v) for k, v in run["hd_p95_ms"].items()]
    return out


def _numbers_problem(values: Iterable[tuple[str, Any]]) -> str:
    """What is wrong with the first stored figure that is not a finite number >= 0 or null ("" when
    none), worded as `field_problem` words it. The verdicts take logs and ratios of these, and pool
    every file into the variance priors, so one NaN or string would break every compared test."""
    for where, value in values:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{where} is {value!r}, not a number"
        if not math.isfinite(value) or value < 0:
            return f"{where} is {value!r}, not a finite number >= 0"
    return ""


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """The one converter of older baselines, in place: schema 1 → 2 marks each engine config stored from
    vLLM's log line (no `config_source`) as such, so its diff against a /server_info one is one line.
    The file on disk changes only when --update-baselines rewrites it."""
    if data["schema"] == 1:
        for config in (data["under_test"].get("engine_config") or {}).values():
            if isinstance(config, dict) and config and "config_source" not in config:
                config["config_source"] = LOG_LINE_ERA
        data["schema"] = 2
    return data
