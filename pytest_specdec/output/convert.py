"""Convert baseline, crossover, results and calibration files of an older schema to the current one, in place,
keeping every night: `pytest-specdec convert-schema PATH...` (the command `formats.CONVERT` that the readers name
for an older file).

A directory is searched for the formats' files (*.json, *.crossover, *.calibration); a file of the current schema
is left as it is, and a file of none of the formats is named and skipped. The steps between the schemas are the
formats' own (`gate.baselines.BASELINE_FILE` and `CROSSOVER_FILE`, `output.schema.RESULTS_FILE`,
`gate.calibration.CALIBRATION_FILE`): this command finds each file's format, brings it to the current version,
and writes it in the format's one text form, so no reader guesses which version wrote a field:

* baselines, schema 1 → 2: an engine config stored from vLLM's log line (no `config_source`) is marked
  `config_source: "log line (schema 1)"`; 2 → 3: each run takes the registry's names (`itl_ms` →
  `itl_token_ms`) and every field of the run record, with what its absence meant (`latency_untrusted: []`:
  trusted; `invalid_reasons: []`; a figure never recorded: null);
* results, schema 1 → 2: fields schema 1 grew one by one get what their absence meant;
  2 → 3: the summary takes the registry's names; 3 → 4: each run carries the run record's
  `accepted_per_pos` (accepted tokens per draft position as counts: its rates times its drafts), and an
  engine config printed as vLLM's text gets its capture size and token budget as numbers; 4 → 5:
  `gate.settings.fdr` is `gate.settings.multiplicity` (it holds `bh` or `holm`, and Holm is no FDR method).

Each converted file is read back by the format's own reader, and keeps as many sessions, tests and runs as it
had; otherwise nothing is written and the command fails naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from pytest_specdec.errors import SpecDecError
from pytest_specdec.formats import FileFormat
from pytest_specdec.gate.baselines import BASELINE_FILE, CROSSOVER_FILE
from pytest_specdec.gate.calibration import CALIBRATION_FILE
from pytest_specdec.output.schema import RESULTS_FILE

#: The formats this command converts, in the order a file is tried against them (the calibration record, told by its
#: named schema, first: it has `sessions` and `tests` too).
CONVERTED: tuple[FileFormat, ...] = (CALIBRATION_FILE, BASELINE_FILE, CROSSOVER_FILE, RESULTS_FILE)
#: What a skipped file is not, in the command's line.
_KINDS = ", ".join(f.kind for f in CONVERTED[:-1]) + f" or {CONVERTED[-1].kind}"


class ConvertError(SpecDecError):
    """A file that cannot be converted; the message names it."""


def convert_file(path: Path) -> str:
    """Convert one file in place; what was done, as one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConvertError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") is None:
        return f"skipped {path}: not a {_KINDS} file (no `schema`)"
    fmt = next((f for f in CONVERTED if f.detect(data)), None)
    if fmt is None:
        return f"skipped {path}: not a {_KINDS} file (none of their fields)"
    kind, current, version = fmt.kind, fmt.version, fmt.version_in(data)
    if version == current:
        return f"current {path}: {kind} schema {version}"
    if not fmt.older(version):
        raise ConvertError(f"{path}: {kind} schema {data['schema']!r} is not one this command converts (1 to "
                           f"{current - 1})")
    try:
        new = fmt.migrate(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConvertError(f"{path}: not a {kind} file as schema {version} wrote it ({exc!r} is missing or "
                           "malformed)") from None
    if fmt.counts(new) != fmt.counts(data):
        raise ConvertError(f"{path}: the conversion would change its {kind} counts {fmt.counts(data)} → "
                           f"{fmt.counts(new)}")
    written = fmt.render(new)
    try:  # the format's own reader: what it cannot read is not written
        fmt.read(json.loads(written), str(path))
    except SpecDecError as exc:
        raise ConvertError(f"{path}: converted, it does not read back ({exc}); nothing written") from None
    path.write_text(written, encoding="utf-8")
    return f"converted {path}: {kind} schema {version} → {current} ({fmt.counted} {fmt.counts(new)} kept)"


def files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted({found for suffix in {f.suffix for f in CONVERTED} for found in p.rglob(f"*{suffix}")})
        elif p.exists():
            out.append(p)
        else:
            raise ConvertError(f"{p}: no such file or directory")
    return out


def convert_paths(paths: Iterable[Path]) -> Iterator[str]:
    """Convert every file of the CONVERTED formats among ``paths`` (directories searched for their suffixes), one
    line per file as it is done. The first file that cannot be converted stops it with a ConvertError naming that
    file."""
    for path in files(paths):
        yield convert_file(path)
