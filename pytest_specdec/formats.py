"""Each file format the plugin writes, declared once: its version, its one text form, its reader, and the step
from each older version to the next (`FileFormat`).

The formats themselves are declared beside their readers: the baseline file and a sweep's crossover record in
`gate/baselines.py` (`BASELINE_FILE`, `CROSSOVER_FILE`), the results file in `output/schema.py`
(`RESULTS_FILE`), a host's calibration record in `gate/calibration.py` (`CALIBRATION_FILE`). Their readers refuse
any other version and name `CONVERT`, which ships with the package (`pytest-specdec convert-schema`,
`output/convert.py`) and brings an older file to the current version through the format's own steps. Bump a version
where a field changes meaning or shape, and give the format the step from the one before."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Baseline files: `<baselines>/<profile>/<hardware>/<suite module>/<test>.json`.
BASELINE_SCHEMA = 3
#: Results files: `reports/specdec-<UTC stamp>.json` (and --specdec-json).
RESULTS_SCHEMA = 5
#: A concurrency sweep's crossover record beside its tests' baseline files (`<sweep>.crossover`).
SWEEP_SCHEMA = 1
#: A host's calibration record beside its baselines (`<profile>/<hardware>/host.calibration`), its `schema` named:
#: ``"pytest-specdec/calibration/<version>"``.
CALIBRATION_SCHEMA = 1
#: The GPU lease file a host's sessions share (`servers/gpus.py`); transient, never converted.
LEASE_SCHEMA = 1
#: How a file of an older schema is brought to the current one, wherever the package is installed.
CONVERT = "pytest-specdec convert-schema"

Data = dict[str, Any]


def version_of(data: Any) -> int | None:
    """A parsed file's `schema`, when it is an integer (a bool is not one)."""
    version = data.get("schema") if isinstance(data, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


@dataclass(frozen=True)
class FileFormat:
    """One file format: what it is called in messages, its current version, how a file of it is told apart, its
    one text form (what the session writes and `convert-schema` writes back), its reader (what the plugin accepts:
    raises on anything else), its counts (what a conversion must keep), and the step from each older version.

    Why one value: the writer's text, the reader and the migrations of a format were three modules apart; a
    version bumped in one and not taught to the others was found by tests alone."""

    kind: str
    version: int
    #: True for a parsed JSON object of this format (whatever its version).
    detect: Callable[[Data], bool]
    render: Callable[[Any], str]
    #: The plugin's own reader, given the parsed file and the name its errors use.
    read: Callable[[Data, str], Any]
    #: (sessions or tests, runs): what a conversion keeps.
    counts: Callable[[Mapping[str, Any]], tuple[int, int]]
    #: ``steps[v]`` takes a file of version ``v`` to ``v + 1``, in place.
    steps: Mapping[int, Callable[[Data], Data]] = field(default_factory=dict)
    #: What the counts are of, in the convert command's line.
    counted: str = "sessions, runs"
    #: The suffix of its files' names (what `convert-schema` looks for in a directory).
    suffix: str = ".json"
    #: For a format whose `schema` is a named string, ``"<tag>/<version>"`` (the calibration record's), the tag;
    #: "" where it is the bare version number.
    tag: str = ""

    def __post_init__(self) -> None:
        missing = [v for v in range(1, self.version) if v not in self.steps]
        if missing:
            raise ValueError(f"{self.kind} format: no step from version(s) {missing} to the next")

    def older(self, version: int | None) -> bool:
        """A version this format's steps bring to the current one (every older one: `__post_init__` checks each has
        its step)."""
        return version is not None and 1 <= version < self.version

    def schema_of(self, version: int) -> int | str:
        """The `schema` value a file of ``version`` holds."""
        return f"{self.tag}/{version}" if self.tag else version

    def version_in(self, data: Any) -> int | None:
        """A parsed file's version as this format writes it (None when it holds none this format could have)."""
        if not self.tag:
            return version_of(data)
        schema = data.get("schema") if isinstance(data, dict) else None
        prefix = f"{self.tag}/"
        if isinstance(schema, str) and schema.startswith(prefix) and schema[len(prefix):].isdigit():
            return int(schema[len(prefix):])
        return None

    def version_problem(self, data: Data, name: str) -> tuple[str, bool] | None:
        """Why ``data`` (the file ``name``) is not of this format's current version, and whether it is an older one
        (which `CONVERT` brings forward); None when it is current. One wording for every format's readers."""
        version = self.version_in(data)
        if self.older(version):
            assert version is not None
            keeps = " and ".join(self.counted.split(", "))
            return (f"{name}: {self.kind} of schema {self.schema_of(version)}, an older format than this plugin's "
                    f"{self.schema_of(self.version)}; convert it, keeping its {keeps}, with `{CONVERT} {name}`"), True
        if version != self.version:
            got = data.get("schema") if isinstance(data, dict) else None
            return (f"{name}: `schema` is {got!r}; this plugin reads the {self.kind} format of schema "
                    f"{self.schema_of(self.version)} (a newer plugin wrote it, or it is not a pytest-specdec "
                    f"{self.kind} file)"), False
        return None

    def migrate(self, data: Data) -> Data:
        """A copy of ``data`` brought to the current version, one step after another (``data`` is left as is)."""
        out = copy.deepcopy(data)
        version = self.version_in(out)
        if not self.older(version):
            raise ValueError(f"{self.kind} schema {out.get('schema')!r} is not one this plugin converts "
                             f"(1 to {self.version - 1})")
        assert version is not None
        for v in range(version, self.version):
            out = self.steps[v](out)
            out["schema"] = self.schema_of(v + 1)
        return out
